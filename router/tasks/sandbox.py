"""Run generated programs (MBPP / HumanEval tests) isolated from the machine, and judge them fairly.

Isolation is the operating system's, not Python's (README, "What the sandbox guarantees"):
each program runs under bubblewrap in its own user, network, mount, PID, IPC and UTS namespaces,
with a read-only view of /usr and the Python installation only (no /etc, /home, /root, /work, no
other process's /proc), a read-only root and /dev (four devices, no /dev/shm), a private 16 MB tmpfs
as /tmp, no network (its own empty loopback), all capabilities dropped, the program as the
namespace's PID 1, and no way to start a process: a seccomp filter installed before the program
runs refuses fork, vfork, execve and every clone that is not a thread, and ptrace,
process_vm_readv/writev, kcmp, pidfd_getfd, userfaultfd, io_uring, perf_event_open and bpf. CPU time, address
space and file size are limited (rlimits); stdout is discarded and stderr goes to a file capped at
1 MB, so output cannot grow the evaluator's memory or block it. On timeout the whole namespace is
killed (its init dies with bubblewrap), grandchildren included.

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
`os._exit(0)` or a crash before the tests finish is a failure, whatever the exit status.
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

# Runs first in the child, before the program: limits, the no-new-process seccomp filter, then the
# program inside a try. Only the tests reaching their end writes the parent's one-time token (read
# from stdin, which is then empty) to the result file: exiting early cannot look like a pass.
GUARD = r'''
import ctypes, os, platform, resource, struct, sys
_token = sys.stdin.readline().strip()
_mem, _cpu, _fsize, _result_fd = (int(a) for a in sys.argv[2:6])
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

def _no_new_processes():
    """seccomp: fork, vfork, execve, execveat and non-thread clones fail with EPERM (clone3 with
    ENOSYS, so the C library falls back to clone, which is checked); so do mount, umount, chroot,
    pivot_root, unshare and setns (root inside an unshare namespace must not remount its view rw), and
    every way to reach into another process or the kernel's less-used corners: ptrace,
    process_vm_readv/writev, kcmp, pidfd_getfd, userfaultfd, io_uring, perf_event_open, bpf."""
    mounts = (428, 429, 430, 431, 432, 433, 442)  # open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr
    # io_uring_setup/enter/register and pidfd_getfd: the same numbers on both architectures
    shared = (425, 426, 427, 438)
    arch = {"x86_64": (0xC000003E, 57, 58, 59, 322, 56, (165, 166, 155, 161, 272, 308),
                       (101, 310, 311, 312, 323, 298, 321)),
            "aarch64": (0xC00000B7, -1, -1, 221, 281, 220, (40, 39, 41, 51, 97, 268),
                        (117, 270, 271, 272, 282, 241, 280))}
    if platform.machine() not in arch:
        raise OSError(f"no seccomp filter for {platform.machine()}")
    # others: ptrace, process_vm_readv, process_vm_writev, kcmp, userfaultfd, perf_event_open, bpf
    audit, fork, vfork, execve, execveat, clone, fs, others = arch[platform.machine()]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    ins = lambda code, jt, jf, k: struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    deny = [n for n in (fork, vfork, execve, execveat, *fs, *mounts, *others, *shared) if n >= 0]
    prog = [ins(ld, 0, 0, 4), ins(jeq, 1, 0, audit), ins(ret, 0, 0, eperm), ins(ld, 0, 0, 0)]
    for n in deny:
        prog += [ins(jeq, 0, 1, n), ins(ret, 0, 0, eperm)]
    prog += [ins(jeq, 0, 1, 435), ins(ret, 0, 0, enosys),  # clone3
             ins(jeq, 0, 3, clone), ins(ld, 0, 0, 16), ins(jset, 1, 0, 0x10000),  # clone: CLONE_THREAD?
             ins(ret, 0, 0, eperm), ins(ret, 0, 0, allow)]
    blob = b"".join(prog)
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(Prog(len(prog), blob)), 0, 0):
        raise OSError(ctypes.get_errno(), "seccomp filter refused")

_no_new_processes()
del _no_new_processes
with open(sys.argv[1]) as _f:
    _code = compile(_f.read(), "program.py", "exec")
try:
    exec(_code, {"__name__": "__main__"})
except BaseException as _err:  # SystemExit included: exiting before the tests end is a failure
    import traceback
    traceback.print_exception(_err)
    os._exit(1)
os.write(_result_fd, _token.encode())
os._exit(0)
'''


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
    """Run `code` (the candidate followed by its tests) isolated; passed = the tests ran to their end."""
    mode = resolve_sandbox(sandbox)
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="specroute-exec-") as folder:
        folder = Path(folder)
        (folder / "program.py").write_text(code)
        (folder / "guard.py").write_text(GUARD)
        with open(folder / "stderr", "wb") as err, open(folder / "result", "wb") as result:
            limits = [str(memory_mb << 20), str(int(timeout_s) + 1), str(STDERR_CAP), str(result.fileno())]
            if mode == "bwrap":
                argv = _bwrap_argv(folder) + [
                    "--ro-bind",
                    str(folder / "guard.py"),
                    "/tmp/guard.py",
                    _interpreter(),
                    "-I",
                    "/tmp/guard.py",
                    "/tmp/program.py",
                    *limits,
                ]
                env = {"PATH": "/usr/bin:/bin"}
            elif mode == "unshare":
                (folder / "root").mkdir()
                argv = _unshare_argv(folder) + [_interpreter(), "-I", "/tmp/guard.py", "/tmp/program.py", *limits]
                env = {
                    "PATH": UNSHARE_PATH,
                    "SANDBOX_DIR": str(folder),
                    "PYPREFIX": _python_prefix(),
                    "HOME": "/tmp",
                    "LANG": "C.UTF-8",
                    "PYTHONHASHSEED": "0",
                }
            else:
                argv = [_interpreter(), "-I", str(folder / "guard.py"), str(folder / "program.py"), *limits]
                env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
            status = _run(argv, env, folder, token, err, result, timeout_s)
        if status == "timeout":
            return Outcome("timeout", f"killed after {timeout_s:g} s")
        if (folder / "result").read_bytes() == token.encode():
            return Outcome("passed")
        tail = (folder / "stderr").read_bytes()[-2000:].decode(errors="replace").strip().splitlines()
        return Outcome("failed", tail[-1][:300] if tail else f"exit status {status}")


def _run(argv, env, folder: Path, token: str, err, result, timeout_s: float) -> str | int:
    """Start the program with stdout discarded, stderr and the result going to files (never pipes, so
    nothing it leaves behind can block us), the token on stdin; its exit status or "timeout"."""
    proc = subprocess.Popen(
        argv,
        cwd=folder,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=err,
        pass_fds=(result.fileno(),),
        start_new_session=True,
    )
    try:
        proc.stdin.write(token.encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it ended before reading: judged by the missing token
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # bubblewrap dies, and its namespace with it
        proc.wait()
        return "timeout"
