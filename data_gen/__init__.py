"""specroute data_gen stage (see design.md); filled in by its own issue."""
