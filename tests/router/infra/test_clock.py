"""The pause-aware clock: time spent stopped by SIGTSTP is left out of every latency."""

import signal
import subprocess
import sys
import time

import pytest

CHILD = """
import sys, time
from router.infra import clock
assert clock.pause_aware()
print("ready", flush=True)
wall, paused = time.perf_counter(), clock.now()
deadline = time.perf_counter() + 2.0
while time.perf_counter() < deadline:  # busy, as a decoding loop is
    pass
print(f"{time.perf_counter() - wall:.3f} {clock.now() - paused:.3f} {clock.paused_seconds():.3f}", flush=True)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGTSTP"), reason="POSIX signals only")
def test_a_paused_process_does_not_count_the_pause():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    child.send_signal(signal.SIGTSTP)
    time.sleep(2.0)  # stopped: the child's busy loop cannot reach its deadline meanwhile
    child.send_signal(signal.SIGCONT)
    wall, measured, paused = map(float, child.stdout.readline().split())
    assert child.wait(timeout=30) == 0
    assert paused > 1.5 and wall >= 2.0  # the deadline is on the plain clock: it passed during the pause
    assert measured == pytest.approx(wall - paused, abs=0.05) and measured < wall - 1.5


def test_interleaved_cells_run_every_method_per_batch_in_a_rotating_order():
    from router.infra.clock import interleaved

    cells = list(interleaved(4, ["a", "b", "c"]))
    assert sorted(cells) == sorted((b, m) for b in range(4) for m in "abc")  # every cell once
    assert [b for b, _ in cells] == sorted(b for b, _ in cells)  # a batch is done before the next starts
    assert [cells[i][1] for i in (0, 3, 6, 9)] == ["a", "b", "c", "a"]  # who runs first rotates
    assert list(interleaved(3, [])) == []


def test_median_seconds_times_each_function_after_its_warmup_and_ignores_one_slow_call(monkeypatch):
    from router.infra import clock

    fake = {"t": 0.0}
    monkeypatch.setattr(clock, "now", lambda: fake["t"])
    calls = {"a": 0, "b": 0}

    def call(name, seconds):
        def fn():
            calls[name] += 1
            fake["t"] += 100.0 if (name == "b" and calls[name] == 4) else seconds  # one slow timed call of b

        return fn

    out = clock.median_seconds({"a": call("a", 1.0), "b": call("b", 3.0)}, repeats=5, warmup=2)
    assert out == {"a": 1.0, "b": 3.0}
    assert calls == {"a": 7, "b": 7}  # 2 untimed + 5 timed each
    assert clock.median([5.0, 1.0, 3.0, 2.0]) == 3.0
