"""Run generated programs (MBPP / HumanEval tests) in a separate, locked-down Python process.

Never in the evaluator's own process: each program runs in `python -I` (isolated mode: no user
site, no PYTHON* variables) in a fresh temporary folder, in its own session so a timeout kills the
whole process group, with CPU-time, memory, file-size and process limits, and an audit hook,
installed before the program runs and impossible to remove from Python, that refuses sockets,
subprocesses, forks and exec. A program that loops forever is killed at the timeout and counted,
never hangs the evaluator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# runs first in the child: what a generated program may not do, enforced by an audit hook
GUARD = r'''
import resource, sys
_mem, _cpu = int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # 1 MB of files at most
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_BLOCKED = ("socket.", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork",
            "os.forkpty", "os.kill", "os.killpg", "shutil.rmtree", "os.remove", "os.unlink", "os.rmdir")
def _guard(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed in evaluated programs")
sys.addaudithook(_guard)
del _guard
with open(sys.argv[1]) as _f:
    _code = compile(_f.read(), "program.py", "exec")
exec(_code, {"__name__": "__main__"})
'''


@dataclass
class Outcome:
    """How one program ended: passed | failed (an exception, e.g. a failing assert) | timeout."""

    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_program(code: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> Outcome:
    """Run `code` (a program with its tests) in a sandboxed subprocess; pass = exit status 0."""
    with tempfile.TemporaryDirectory(prefix="specroute-exec-") as folder:
        path = Path(folder) / "program.py"
        path.write_text(code)
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        # limits are set by the child itself (GUARD): no preexec_fn, which is unsafe in a threaded parent
        argv = [sys.executable, "-I", "-c", GUARD, str(path), str(memory_mb << 20), str(int(timeout_s) + 1)]
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the program may have spawned threads
            proc.communicate()
            return Outcome("timeout", f"killed after {timeout_s:g} s")
        if proc.returncode == 0:
            return Outcome("passed")
        lines = err.decode(errors="replace").strip().splitlines()
        return Outcome("failed", lines[-1][:300] if lines else f"exit status {proc.returncode}")
