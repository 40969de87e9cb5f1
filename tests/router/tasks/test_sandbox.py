"""The sandbox for generated programs holds: every escape an adversarial review found is attempted
and fails (targets: this test's own temp dir, its own processes and 127.0.0.1 only); judging counts
a pass only when the tests run to their end."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from router.tasks import sandbox as executor
from router.tasks.sandbox import SandboxUnavailable, run_program

WORKS = {"bwrap": executor.bwrap_works, "unshare": executor.unshare_works}


@pytest.fixture(params=["bwrap", "unshare"])
def isolation(request):
    """Each OS-isolated sandbox this machine can run (bubblewrap: scripts/setup.sh installs it as root;
    unshare: util-linux with user namespaces)."""
    if not WORKS[request.param]():
        pytest.skip(f"{request.param} cannot create namespaces here")
    return request.param


def _ran(code: str, **kw) -> str:
    return run_program(code, timeout_s=kw.pop("timeout_s", 5.0), **kw).status


@pytest.mark.parametrize(
    "early_exit", ["import sys\nsys.exit(0)", "raise SystemExit(0)", "import os\nos._exit(0)", "import sys\nsys.exit()"]
)
@pytest.mark.parametrize("sandbox", [None, "python"])
def test_exiting_before_the_tests_is_a_failure(early_exit, sandbox):  # None: the best isolation here
    """A completion ending in `sys.exit(0)` used to pass without running a test."""
    assert _ran(f"{early_exit}\nassert 1 == 2\n", sandbox=sandbox) == "failed"
    assert _ran("def f():\n    return 2\nassert f() == 2\n", sandbox=sandbox) == "passed"


def test_the_guard_cannot_be_switched_off_and_nothing_reaches_outside(tmp_path, isolation):
    target = tmp_path / "pwned"
    escapes = [
        f"import sys\nsys.modules['__main__']._BLOCKED = ('x',)\nimport os\nos.system('touch {target}')",
        f"import ctypes\nctypes.CDLL(None).system(b'touch {target}')",
        f"open('{target}', 'w').write('x')",
        f"import os\nos.rename('{tmp_path / 'keep'}', '{target}')",
    ]
    (tmp_path / "keep").write_text("mine")
    for code in escapes:
        run_program(code + "\n", timeout_s=5, sandbox=isolation)
        assert not target.exists(), code
    assert (tmp_path / "keep").read_text() == "mine"


def test_files_outside_cannot_be_deleted_truncated_or_read(tmp_path, monkeypatch, isolation):
    keep, folder = tmp_path / "keep.txt", tmp_path / "folder"
    keep.write_text("precious")
    folder.mkdir()
    for code in (
        f"import os\nos.unlink('{keep}')",
        f"import os\nos.rmdir('{folder}')",
        f"open('{keep}', 'w')",
        f"import ctypes\nctypes.CDLL(None).unlink(b'{keep}')",
        f"import shutil\nshutil.rmtree('{tmp_path}')",
    ):
        run_program(code + "\n", timeout_s=5, sandbox=isolation)
    assert keep.read_text() == "precious" and folder.is_dir()
    assert _ran("open('/etc/passwd').read()\n", sandbox=isolation) == "failed"
    assert _ran(f"open('{keep}').read()\n", sandbox=isolation) == "failed"
    assert _ran("open('/usr/specroute-was-here', 'w')\n", sandbox=isolation) == "failed"
    remount = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "assert libc.mount(b'none', b'/usr', None, 32 | 4096, None) == 0\n"
    )  # MS_REMOUNT | MS_BIND, rw
    assert _ran(remount, sandbox=isolation) == "failed"
    assert not Path("/usr/specroute-was-here").exists()
    # the evaluator's environment is not visible through /proc
    monkeypatch.setenv("SPECROUTE_TEST_SECRET", "s3cr3t-value")
    leak = (
        "import glob\nfor f in glob.glob('/proc/*/environ'):\n    try:\n        data = open(f, 'rb').read()\n"
        "    except OSError:\n        continue\n    assert b's3cr3t-value' not in data, f\n"
    )
    assert _ran(leak, sandbox=isolation) == "passed"
    assert _ran(f"import os\nos.stat('/proc/{os.getpid()}')\n", sandbox=isolation) == "failed"


def test_no_network_even_to_localhost(isolation):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    waiter = threading.Thread(target=accept)
    waiter.start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    assert _ran(code, sandbox=isolation) == "failed"
    ctypes_code = (
        "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\n"
        f"addr = struct.pack('<HH4s8x', 2, socket.htons({port}), bytes([127, 0, 0, 1]))\n"
        "assert libc.connect(fd, addr, len(addr)) == 0\n"
    )
    assert _ran(ctypes_code, sandbox=isolation) == "failed"
    waiter.join()
    server.close()
    assert not accepted


def test_no_new_processes_and_no_signals_outside(isolation):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        attempts = [
            f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)",
            f"import ctypes\nassert ctypes.CDLL(None).kill({victim.pid}, 9) == 0",
            f"import signal\nfd = signal.pidfd_open({victim.pid})\nsignal.pidfd_send_signal(fd, signal.SIGKILL)",
            "import os\nassert os.fork() >= 0",
            "import ctypes\nassert ctypes.CDLL(None).fork() >= 0",
            "import subprocess\nsubprocess.run(['true'])",
            "import os\nassert os.system('true') == 0",
            "import multiprocessing as mp\np = mp.get_context('spawn').Process(target=print)\np.start()\np.join()\n"
            "assert p.exitcode == 0",
            "import multiprocessing.util, sys\nmultiprocessing.util.spawnv_passfds(sys.executable, [sys.executable, "
            "'-c', 'pass'], [])",
            "import os\nos.posix_spawn('/usr/bin/true', ['true'], {})",
        ]
        for code in attempts:
            assert _ran(code + "\n", sandbox=isolation) == "failed", code
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


def test_a_fork_bomb_is_contained(isolation):
    started = time.monotonic()
    outcome = run_program("import os\nwhile True:\n    os.fork()\n", timeout_s=3, sandbox=isolation)
    assert outcome.status == "failed" and "Operation not permitted" in outcome.detail
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("sandbox", ["bwrap", "unshare", "python"])
def test_output_floods_are_capped_and_the_timeout_holds(sandbox):
    if sandbox in WORKS and not WORKS[sandbox]():
        pytest.skip(f"{sandbox} cannot create namespaces here")
    started = time.monotonic()
    outcome = run_program("import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n", timeout_s=3, sandbox=sandbox)
    elapsed = time.monotonic() - started
    assert outcome.status in ("failed", "timeout") and elapsed < 8  # stderr stops at 1 MB (SIGXFSZ)
    flood = run_program("import sys\nwhile True:\n    print('y' * 65536)\n", timeout_s=2, sandbox=sandbox)
    assert flood.status == "timeout" and time.monotonic() - started < 16  # stdout is discarded, not buffered


def test_without_bubblewrap_unshare_isolates_and_without_both_programs_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(executor, "bwrap_works", lambda: False)
    monkeypatch.delenv("SPECROUTE_SANDBOX", raising=False)
    if executor.unshare_works():
        assert executor.resolve_sandbox() == "unshare"
    monkeypatch.setattr(executor, "unshare_works", lambda: False)
    monkeypatch.delenv("SPECROUTE_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        run_program("pass\n")
    executor._WARNED.clear()
    assert run_program("assert True\n", sandbox="python").passed
    assert "WARNING" in capsys.readouterr().err
    monkeypatch.setenv("SPECROUTE_SANDBOX", "python")
    assert run_program("assert True\n").passed
    with pytest.raises(ValueError, match="sandbox must be one of"):
        run_program("pass\n", sandbox="docker")


def test_code_metrics_check_the_sandbox_before_any_decoding(monkeypatch):
    from router.tasks.metrics import get_metric

    monkeypatch.setattr(executor, "bwrap_works", lambda: False)
    monkeypatch.setattr(executor, "unshare_works", lambda: False)
    monkeypatch.delenv("SPECROUTE_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable):
        get_metric("mbpp")
    assert get_metric("gsm8k")  # no programs: no sandbox needed
    mbpp = get_metric("mbpp", sandbox="python")
    assert (
        mbpp("```python\ndef add(a, b):\n    return a + b\n```", {"tests": ["assert add(1, 2) == 3"]})["quality"] == 1
    )
    exits = "```python\ndef add(a, b):\n    return 0\nimport sys\nsys.exit(0)\n```"
    assert mbpp(exits, {"tests": ["assert add(1, 2) == 3"]})["quality"] == 0


# The attacks a bubblewrap review found: a writable /dev (/dev/shm: a tmpfs of half the machine's RAM)
# and a ptrace of the sandbox's own PID 1 (bubblewrap's init, without the seccomp filter or rlimits).
FILL_EVERY_WRITABLE_PLACE = r"""
import os
chunk = b"0" * (512 << 10)  # under the 1 MB file-size limit: many files, not one big one
held = {}
for folder in PLACES:
    written = 0
    try:
        while written < (32 << 20):  # past the 16 MB /tmp cap
            with open(os.path.join(folder, f"fill{written}"), "wb") as f:
                f.write(chunk)
            written += len(chunk)
    except OSError:
        pass
    if written >= (32 << 20):
        held[folder] = written
assert not held, held
"""
EVERY_PLACE = '("/dev", "/dev/shm", "/tmp", "/", "/proc", "/run", "/var/tmp", "/sys")'


PTRACE_EVERYONE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"x86_64": dict(ptrace=101, process_vm_readv=310, process_vm_writev=311, userfaultfd=323,
                     io_uring_setup=425, perf_event_open=298, pidfd_getfd=438),
      "aarch64": dict(ptrace=117, process_vm_readv=270, process_vm_writev=271, userfaultfd=282,
                      io_uring_setup=425, perf_event_open=241, pidfd_getfd=438)}[os.uname().machine]
targets = TARGETS
allowed = []
for pid in targets:
    if libc.syscall(NR["ptrace"], 16, pid, 0, 0) == 0:  # PTRACE_ATTACH
        allowed.append(("ptrace", pid))
        libc.syscall(NR["ptrace"], 17, pid, 0, 0)  # PTRACE_DETACH
buf = ctypes.create_string_buffer(8)
iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 8)
if libc.syscall(NR["process_vm_readv"], targets[0], iov, 1, iov, 1, 0) >= 0:
    allowed.append(("process_vm_readv", targets[0]))
if SANDBOXED:  # never write into a process outside a sandbox
    if libc.syscall(NR["process_vm_writev"], targets[0], iov, 1, iov, 1, 0) >= 0:
        allowed.append(("process_vm_writev", targets[0]))
    for name, args in (("userfaultfd", (0,)), ("io_uring_setup", (4, ctypes.create_string_buffer(120))),
                       ("pidfd_getfd", (0, 0, 0))):
        if libc.syscall(NR[name], *args) >= 0:
            allowed.append((name,))
assert not allowed, allowed
"""
IN_SANDBOX = PTRACE_EVERYONE.replace("TARGETS", "(1, os.getppid(), 2)").replace("SANDBOXED", "True")


def test_no_writable_place_holds_more_than_the_tmp_cap(isolation):
    assert _ran(FILL_EVERY_WRITABLE_PLACE.replace("PLACES", EVERY_PLACE), sandbox=isolation, timeout_s=20) == "passed"


@pytest.mark.parametrize("sandbox", ["bwrap", "unshare", "python"])
def test_no_process_can_be_traced_or_its_memory_read(sandbox):
    if sandbox in WORKS and not WORKS[sandbox]():
        pytest.skip(f"{sandbox} cannot create namespaces here")
    assert _ran(IN_SANDBOX, sandbox=sandbox) == "passed"


def test_the_attacks_are_real_outside_the_sandbox(tmp_path):
    """The attack programs are not vacuous: run as a plain process here, they find what they look for."""
    fill = tmp_path / "fill.py"
    fill.write_text(FILL_EVERY_WRITABLE_PLACE.replace("PLACES", f"({str(tmp_path)!r},)"))
    assert subprocess.run([sys.executable, str(fill)], capture_output=True).returncode != 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        probe = PTRACE_EVERYONE.replace("TARGETS", f"({child.pid},)").replace("SANDBOXED", "False")
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
        assert run.returncode != 0 and "ptrace" in run.stderr
    finally:
        child.kill()
        child.wait()


KEYRING = (
    "import ctypes, errno\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "blob = ctypes.create_string_buffer(1 << 20)\n"
    "r = libc.syscall(248, b'user', b'k', blob, 1 << 20, -2)  # add_key into the session keyring\n"
    "assert r == -1 and ctypes.get_errno() == errno.EPERM, (r, ctypes.get_errno())\n"
)


@pytest.mark.parametrize("sandbox", ["bwrap", "unshare", "python"])
def test_kernel_keyrings_hold_no_memory_the_cap_does_not_count(sandbox):
    """add_key kept 25 MB in the kernel's keyrings, outside the address-space limit: refused by the filter."""
    if sandbox in WORKS and not WORKS[sandbox]():
        pytest.skip(f"{sandbox} cannot create namespaces here")
    if os.uname().machine != "x86_64":
        pytest.skip("the program calls add_key by its x86_64 number")
    assert _ran(KEYRING, sandbox=sandbox) == "passed"


DOCUMENTED_VIEW = (
    "import os, sys\n"
    "src = open('/tmp/program.py' if os.path.exists('/tmp/program.py') else 'program.py').read()\n"
    "assert 'assert 1 + 1 == 2' in src  # its own tests, readable (the reference harness holds them in memory)\n"
    "prefix = sys.base_prefix\n"
    "assert os.path.isdir(prefix) and os.listdir(prefix)  # the Python installation, wherever it lives\n"
    "try:\n    open(os.path.join(prefix, 'specroute-probe'), 'w')\n    writable = True\n"
    "except OSError:\n    writable = False\n"
    "assert not writable\n"
)


def test_the_documented_view_a_program_reads_its_tests_and_the_python_installation(isolation):
    """docs/sandbox.md: a program can read its own file (the candidate and its test asserts) and the Python
    installation it runs on, read-only, wherever that lives (under /root for a pyenv Python)."""
    assert _ran(DOCUMENTED_VIEW + "assert 1 + 1 == 2\n", sandbox=isolation) == "passed"
