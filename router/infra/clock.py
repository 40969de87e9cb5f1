"""A clock that leaves out the time the process was paused, so latencies stay true when a long job
is paused to lend the CPU to something else.

Pause a running `specroute eval` / `demo` / `gen` with Ctrl-Z or `kill -TSTP <pid>` and resume it
with `fg` or `kill -CONT <pid>`: every timer in the decoding loop and the eval reads `now()`, which
does not advance while the process is stopped. (SIGSTOP cannot be caught, so `kill -STOP` still
counts the pause: use TSTP.) Python runs the handler between bytecodes, so a model forward in flight
finishes before the process stops; that time is real work and is counted.
"""

from __future__ import annotations

from collections.abc import Iterator

import os
import signal
import threading
import time

_paused = 0.0  # seconds the process has spent stopped by SIGTSTP since start


def now() -> float:
    """Seconds on a monotonic clock, minus the time spent paused (SIGTSTP)."""
    return time.perf_counter() - _paused


def paused_seconds() -> float:
    """Seconds spent paused so far."""
    return _paused


def _stop_and_count(signum, frame) -> None:
    global _paused
    started = time.perf_counter()
    os.kill(os.getpid(), signal.SIGSTOP)  # returns once the process is continued (SIGCONT)
    _paused += time.perf_counter() - started


def pause_aware() -> bool:
    """Make SIGTSTP pause the process with the paused time left out of `now()`; True if installed
    (only possible in the main thread of a POSIX process)."""
    if not hasattr(signal, "SIGTSTP") or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTSTP, _stop_and_count)
    return True


def interleaved(n_batches: int, methods: list) -> Iterator[tuple[int, object]]:
    """Every (batch, method) cell of a timed comparison, batch by batch, each batch running every method
    before the next batch starts, in an order that rotates by one method per batch: a change in the
    machine's speed (another job starting or ending) lands on every method alike, and no method always
    runs first (with warm caches) or last. eval's online grid and benchmarks/decode.py both time this way."""
    for b in range(n_batches):
        k = b % len(methods) if methods else 0
        for method in methods[k:] + methods[:k]:
            yield b, method


def median(values: list[float]) -> float:
    """The middle value (the upper of the two for an even count): a timing summary one slow call cannot move."""
    return sorted(values)[len(values) // 2]


def median_seconds(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Median seconds per call of each function (name -> callable), `warmup` untimed calls each first, then
    `repeats` timed rounds, the order rotating each round (`interleaved`): the benchmarks' one way to time calls."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in fns}
    for _, name in interleaved(repeats, list(fns)):
        started = now()
        fns[name]()
        times[name].append(now() - started)
    return {name: median(t) for name, t in times.items()}
