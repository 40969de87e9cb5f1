"""This machine: dtype auto and the CPU's kind (`hardware`), the pair's measured costs (`costs`) and
the block size they imply (`calibrate`: gamma calibration, gamma auto)."""
