"""Run generated programs (MBPP / HumanEval tests) isolated from the machine, and judge them fairly.

Isolation is the operating system's, not Python's (docs/sandbox.md, "What the sandbox guarantees"):
each program runs under bubblewrap in its own user, network, mount, PID, IPC and UTS namespaces,
with a read-only view of /usr and the Python installation only (no /etc, /home, /root, /work, no
other process's /proc), a read-only root and /dev (four devices, no /dev/shm), a private 16 MB tmpfs
as /tmp, no network (its own empty loopback), all capabilities dropped, the program as the
namespace's PID 1, and no way to start a process: a seccomp filter installed before the program
runs refuses fork, vfork, execve and every clone that is not a thread, and ptrace,
process_vm_readv/writev, kcmp, pidfd_getfd, userfaultfd, io_uring, perf_event_open and bpf. CPU time, address
space and file size are limited (rlimits); stdout is discarded and stderr goes to a file capped at
1 MB, so output cannot grow the evaluator's memory or block it; memory the address-space limit does not
count (memfd, SysV IPC, POSIX mqueues) is refused by the filter. On timeout the program and everything below
it is killed by PID (`kill_tree`): it is its PID namespace's PID 1, so the namespace dies with it, and the
filter refuses setsid, setpgid and PR_SET_PDEATHSIG, so it cannot leave that reach.

Where bubblewrap is missing, util-linux's `unshare` builds the same isolation (user, network,
mount, PID, IPC, UTS namespaces; a tmpfs root with /usr and the Python installation bound
read-only; its own /proc; chroot), running as root inside its user namespace, so the seccomp
filter also refuses mount, umount, chroot, pivot_root, unshare and setns: the view cannot be
remounted writable. Where neither works, programs are refused with the fix (`apt-get install
bubblewrap`; scripts/setup.sh installs it where it can) unless the caller opts into
`sandbox="python"`: the same limits, seccomp filter and judging, but no namespaces (the program can
read, write and delete what the user can, and signal the user's processes), with a warning printed once.

Judging follows the HumanEval harness: the candidate and its tests run as one program inside a
`try`; only reaching the end of the tests counts as a pass. `sys.exit(0)`, `raise SystemExit`,
`os._exit(0)` or a crash before the tests finish is a failure, whatever the exit status. The guard
(sandbox_guard.py) binds its exit path before the program runs and reads the one-time token only after it
returned, so no rebinding and no name the program can reach turns a failure into a pass (docs/sandbox.md).
"""

from __future__ import annotations

import functools
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SANDBOXES = ("auto", "bwrap", "unshare", "python")
STDERR_CAP = 1 << 20  # bytes of stderr (and of any file the program writes) at most
TMPFS_BYTES = 16 << 20  # the program's private /tmp
DEVICES = ("null", "zero", "urandom", "random")  # all of /dev a program sees

# Runs first in the child, before the program: limits, the seccomp filter, then the program as __main__;
# the one-time token is written to the result file only when the program ran to its end (sandbox_guard.py).
GUARD = (Path(__file__).parent / "sandbox_guard.py").read_text()


# unshare's namespace init (util-linux only): a tmpfs root with /usr and the Python prefix bound
# read-only, its own /proc, a few devices, the program and guard copied in; then chroot and run.
NS_INIT = r"""
set -e
R="$SANDBOX_DIR/root"
mount -t tmpfs -o size=16m tmpfs "$R"
mkdir -p "$R/usr" "$R/tmp" "$R/proc" "$R/dev" "$R$PYPREFIX"
mount --rbind /usr "$R/usr"; mount -o remount,ro,bind "$R/usr"
mount --rbind "$PYPREFIX" "$R$PYPREFIX"; mount -o remount,ro,bind "$R$PYPREFIX"
for l in bin lib lib64 lib32 sbin; do if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$R/$l"; fi; done
mount -t proc proc "$R/proc"
for d in null zero urandom random; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
cp "$SANDBOX_DIR/program.py" "$SANDBOX_DIR/guard.py" "$R/tmp/"
cd "$R/tmp"
exec chroot "$R" "$@"
"""


class SandboxUnavailable(ValueError):
    """Programs cannot be isolated here; the message says how to fix it or opt out. (A ValueError, so
    the `specroute` command reports it as a one-line error like any other setting that cannot work.)"""


@dataclass
class Outcome:
    """How one program ended: passed | failed (an exception, a failing assert, an early exit) | timeout."""

    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _python_prefix() -> str:
    return sys.base_prefix  # the interpreter and its standard library (a venv's packages are not needed)


def _interpreter() -> str:
    real = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    return str(real)


def _system_binds() -> list[str]:
    """/usr read-only, and /bin, /lib... as they are here (symlinks into /usr on merged-usr systems)."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        path = Path(top)
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            argv += ["--ro-bind", top, top]
    return argv


# namespaces, nobody inside, no capabilities, dies with us, no terminal, an empty environment
BWRAP_ISOLATION = (
    "bwrap --unshare-all --unshare-user --uid 65534 --gid 65534 --cap-drop ALL --die-with-parent --new-session "
    "--hostname sandbox --clearenv --setenv PATH /usr/bin:/bin --setenv LANG C.UTF-8 --setenv HOME /tmp "
    "--setenv PYTHONHASHSEED 0"
)


def _bwrap_argv(folder: Path) -> list[str]:
    """bubblewrap: namespaces, a read-only view of /usr and the Python installation, private /tmp."""
    argv = [*BWRAP_ISOLATION.split(), *_system_binds()]
    prefix = _python_prefix()
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    interpreter = _interpreter()
    if not interpreter.startswith(("/usr/", prefix)):
        argv += ["--ro-bind", interpreter, interpreter]
    # /dev: not bubblewrap's --dev (a writable tmpfs of half the RAM, /dev/shm included) but an empty
    # tmpfs holding four devices, made read-only; the program runs as PID 1 (--as-pid-1): no init of
    # bubblewrap's stays in the namespace for it to ptrace (the filter refuses ptrace anyway)
    devices = [arg for d in DEVICES for arg in ("--dev-bind", f"/dev/{d}", f"/dev/{d}")]
    return argv + [
        "--as-pid-1",
        "--proc",
        "/proc",
        "--size",
        "65536",
        "--tmpfs",
        "/dev",
        *devices,
        "--remount-ro",
        "/dev",
        "--size",
        str(TMPFS_BYTES),
        "--tmpfs",
        "/tmp",
        "--ro-bind",
        str(folder / "program.py"),
        "/tmp/program.py",
        "--remount-ro",  # bubblewrap's root is a tmpfs without a size: nothing may be written there
        "/",
        "--chdir",
        "/tmp",
    ]


UNSHARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # mount and chroot live in sbin


def _unshare_argv(folder: Path) -> list[str]:
    return [
        "unshare",
        "--user",
        "--map-root-user",
        "--net",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount",
        "--ipc",
        "--uts",
        "sh",
        "-c",
        NS_INIT,
        "sandbox-init",
    ]


@functools.lru_cache(maxsize=None)
def unshare_works() -> bool:
    """True when util-linux's unshare can build the sandbox here (checked once, with a real run)."""
    if not (shutil.which("unshare") and shutil.which("chroot")) or platform.system() != "Linux":
        return False
    with tempfile.TemporaryDirectory(prefix="specroute-probe-") as folder:
        for name in ("program.py", "guard.py", "root"):
            (Path(folder) / name).mkdir() if name == "root" else (Path(folder) / name).write_text("")
        env = {"PATH": UNSHARE_PATH, "SANDBOX_DIR": folder, "PYPREFIX": _python_prefix()}
        try:
            run = subprocess.run(
                _unshare_argv(Path(folder)) + [_interpreter(), "-I", "-c", "pass"],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return run.returncode == 0


@functools.lru_cache(maxsize=None)
def bwrap_works() -> bool:
    """True when bubblewrap is installed and can create its namespaces here (checked once)."""
    if not shutil.which("bwrap") or platform.system() != "Linux":
        return False
    probe = ["bwrap", "--unshare-all", "--unshare-user", *_system_binds(), "/usr/bin/true"]
    try:
        return subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_WARNED: set = set()


def resolve_sandbox(sandbox: str | None = None) -> str:
    """The isolation to use: "bwrap", or "python" only when asked for; refuses otherwise."""
    mode = sandbox or os.environ.get("SPECROUTE_SANDBOX", "auto")
    if mode not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {mode!r}")
    if mode in ("auto", "bwrap") and bwrap_works():
        return "bwrap"
    if mode in ("auto", "unshare") and unshare_works():
        return "unshare"
    if mode != "python":
        raise SandboxUnavailable(
            f"running generated programs (MBPP/HumanEval pass@1) needs OS isolation, and "
            f"{ {'bwrap': 'bubblewrap', 'unshare': 'unshare'}.get(mode, 'neither bubblewrap nor unshare') } "
            f"can{'not' if mode != 'auto' else ''} create namespaces here: `apt-get install bubblewrap` (scripts/setup.sh does this where it can), or "
            f"enable unprivileged user namespaces. To run them anyway with only rlimits and a seccomp filter (no "
            f"namespaces: programs can read, write and delete your files), set sandbox=python in the eval config or "
            f"SPECROUTE_SANDBOX=python"
        )
    if "python" not in _WARNED:
        _WARNED.add("python")
        print(
            "[specroute] WARNING: sandbox=python runs generated programs without OS isolation (rlimits and a "
            "no-new-process seccomp filter only): they can read, write and delete your files and kill your processes. "
            "Install bubblewrap to isolate them.",
            file=sys.stderr,
            flush=True,
        )
    return "python"


def run_program(code: str, timeout_s: float = 10.0, memory_mb: int = 1024, sandbox: str | None = None) -> Outcome:
    """Run `code` (the candidate followed by its tests) isolated; passed = the tests ran to their end: the
    guard exited 0 and the result file holds exactly the one-time token, which waited in a pipe the guard
    reads only after the program returned (sandbox_guard.py)."""
    mode = resolve_sandbox(sandbox)
    try:
        source = code.encode("utf-8")
    except (
        UnicodeEncodeError
    ) as err:  # a lone surrogate: Python cannot compile it, so the reference harness fails it too
        return Outcome("failed", f"the program is not valid text ({err.reason} at character {err.start}): not run")
    token = secrets.token_hex(16).encode()
    with tempfile.TemporaryDirectory(prefix="specroute-exec-") as folder:
        folder = Path(folder)
        (folder / "program.py").write_bytes(source)
        (folder / "guard.py").write_text(GUARD)
        token_read, token_write = os.pipe()
        os.write(token_write, token)
        os.close(token_write)  # the guard's late read gets the token, or nothing once the pipe is drained
        try:
            with open(folder / "stderr", "wb") as err, open(folder / "result", "wb") as result:
                limits = [str(memory_mb << 20), str(int(timeout_s) + 1), str(STDERR_CAP)]
                limits += [str(token_read), str(result.fileno())]
                argv, env = _launch(mode, folder, limits)
                status = _run(argv, env, folder, err, (token_read, result.fileno()), timeout_s)
        finally:
            os.close(token_read)
        if status == "timeout":
            return Outcome("timeout", f"killed after {timeout_s:g} s")
        if status == 0 and (folder / "result").read_bytes() == token:
            return Outcome("passed")
        tail = (folder / "stderr").read_bytes()[-2000:].decode(errors="replace").strip().splitlines()
        return Outcome("failed", tail[-1][:300] if tail else f"exit status {status}")


def _launch(mode: str, folder: Path, limits: list[str]) -> tuple[list[str], dict]:
    """The command line and environment that run the guard (then the program) in `mode`'s isolation."""
    if mode == "bwrap":
        guard = ["--ro-bind", str(folder / "guard.py"), "/tmp/guard.py"]
        argv = _bwrap_argv(folder) + guard + [_interpreter(), "-I", "/tmp/guard.py", "/tmp/program.py", *limits]
        return argv, {"PATH": "/usr/bin:/bin"}
    if mode == "unshare":
        (folder / "root").mkdir()
        argv = _unshare_argv(folder) + [_interpreter(), "-I", "/tmp/guard.py", "/tmp/program.py", *limits]
        env = {"PATH": UNSHARE_PATH, "SANDBOX_DIR": str(folder), "PYPREFIX": _python_prefix()}
        return argv, env | {"HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    argv = [_interpreter(), "-I", str(folder / "guard.py"), str(folder / "program.py"), *limits]
    return argv, {"PATH": "/usr/bin:/bin", "HOME": str(folder), "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}


def _run(argv, env, folder: Path, err, fds: tuple[int, int], timeout_s: float) -> str | int:
    """Start the program with stdin empty, stdout discarded, stderr and the result going to files (never
    pipes it could fill, so nothing it leaves behind can block us); its exit status or "timeout"."""
    proc = subprocess.Popen(
        argv,
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=err,
        pass_fds=fds,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # before the wait reaps it, so the PID cannot belong to anyone else yet
        proc.wait()
        return "timeout"


def _children() -> dict[int, list[int]]:
    """Every process's children, read from /proc/<pid>/stat (no need for CONFIG_PROC_CHILDREN)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # it ended while we looked
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold spaces
        children.setdefault(parent, []).append(int(entry))
    return children


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it, deepest first, by PID: a program that left the process group
    (setsid), or cleared its parent-death signal, is still found while its parent lives. Killing a sandbox's
    PID 1 ends its whole PID namespace, so nothing inside can outlive this. The seccomp filter also refuses
    setsid, setpgid and PR_SET_PDEATHSIG, so the group kill below reaches it too."""
    children, found, queue = _children(), [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue += children.get(current, [])
    for victim in reversed(found):
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
