"""The guard: runs first inside the sandbox, as a script (`python -I guard.py program.py MEM CPU FSIZE TOKEN_FD
RESULT_FD`), never imported by specroute. It sets the limits, installs the seccomp filter, then runs the
program (the candidate followed by its tests) in a module `__main__` whose `__name__` is unset, as the reference
harnesses' `exec(program, {})` runs it (its `if __name__ == "__main__":` block is skipped), and writes the parent's one-time token to the
result file only when the program ran to its end.

Why a pass cannot be faked through Python (tests/router/tasks/test_sandbox_verdict.py, the attacks on the verdict):
- the exit and write calls the verdict needs are bound before the program runs (a function's default
  arguments), so rebinding `os._exit`, `os.write`, `posix.*` or `traceback.print_exception` changes nothing:
  any exception, `SystemExit` included, ends in the original `_exit(1)`;
- the token is not in this process while the program runs: it waits in a pipe the parent filled, and is read
  only after the program returned. `__main__` is the program's own module (not this one), `sys.argv` is the
  program's, and no object, frame or global holds the token; the parent requires the result file to hold
  exactly one token, so a program that writes into it first makes the run fail;
- the limits: only a program that deliberately drains its own file descriptors for the pipe (a scan, not an
  accident) could read the token early; docs/sandbox.md says so.
"""

import builtins
import platform
import posix
import resource
import struct
import sys
import types

# syscall numbers: (audit arch, fork, vfork, execve, execveat, clone, prctl, file-system changers,
# process reachers, session changers, shared-memory makers)
ARCH = {
    "x86_64": dict(
        audit=0xC000003E,
        fork=57,
        vfork=58,
        execve=59,
        execveat=322,
        clone=56,
        prctl=157,
        fs=(165, 166, 155, 161, 272, 308),  # mount umount2 pivot_root chroot unshare setns
        reach=(101, 310, 311, 312, 323, 298, 321),  # ptrace process_vm_readv/writev kcmp userfaultfd perf bpf
        session=(112, 109),  # setsid setpgid: leaving the process group the parent kills
        shm=(319, 29, 30, 68, 64, 240),  # memfd_create shmget shmat msgget semget mq_open
        keys=(248, 249, 250),  # add_key request_key keyctl: kernel keyring memory
    ),
    "aarch64": dict(
        audit=0xC00000B7,
        fork=-1,
        vfork=-1,
        execve=221,
        execveat=281,
        clone=220,
        prctl=167,
        fs=(40, 39, 41, 51, 97, 268),
        reach=(117, 270, 271, 272, 282, 241, 280),
        session=(157, 154),
        shm=(279, 194, 196, 186, 190, 180),
        keys=(217, 218, 219),
    ),
}
MOUNTS = (428, 429, 430, 431, 432, 433, 442)  # open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr
SHARED = (425, 426, 427, 438, 447)  # io_uring_setup/enter/register pidfd_getfd memfd_secret: same on both
CLONE3, CLONE_THREAD, PR_SET_PDEATHSIG, X32_BIT = 435, 0x10000, 1, 0x40000000


def filter_program(machine: str) -> list:
    """The seccomp BPF program, as (code, jt, jf, k) tuples. EPERM for: another architecture's or the x32
    ABI's calls; fork, vfork, execve(at) and non-thread clones (clone3 gets ENOSYS, so the C library falls back
    to clone, which is checked); mount-type calls, chroot, unshare, setns; every way to reach another process
    (ptrace, process_vm_*, kcmp, pidfd_getfd, userfaultfd, io_uring, perf_event_open, bpf); setsid and setpgid
    and prctl(PR_SET_PDEATHSIG) (the process must stay where the parent's kill reaches it); and memory the
    address-space limit does not count (memfd_create, memfd_secret, SysV shm/msg/sem, POSIX mqueues, the kernel
    keyrings: add_key, request_key, keyctl)."""
    if machine not in ARCH:
        raise OSError(f"no seccomp filter for {machine}")
    nr = ARCH[machine]
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    deny = (nr["fork"], nr["vfork"], nr["execve"], nr["execveat"], *nr["fs"], *MOUNTS, *nr["reach"], *SHARED)
    deny += (*nr["session"], *nr["shm"], *nr["keys"])
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, nr["audit"]), (ret, 0, 0, eperm), (ld, 0, 0, 0)]
    prog += [(jset, 0, 1, X32_BIT), (ret, 0, 0, eperm)]  # the x32 ABI: same arch, numbers with bit 30 set
    for n in (n for n in deny if n >= 0):
        prog += [(jeq, 0, 1, n), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, CLONE3), (ret, 0, 0, enosys)]
    # prctl: only PR_SET_PDEATHSIG is refused (args[0] is at offset 16)
    prog += [(jeq, 0, 4, nr["prctl"]), (ld, 0, 0, 16), (jeq, 0, 1, PR_SET_PDEATHSIG), (ret, 0, 0, eperm)]
    prog += [(ret, 0, 0, allow)]
    # clone: a thread (CLONE_THREAD set) is allowed, anything else refused
    prog += [(jeq, 0, 3, nr["clone"]), (ld, 0, 0, 16), (jset, 1, 0, CLONE_THREAD), (ret, 0, 0, eperm)]
    return prog + [(ret, 0, 0, allow)]


def install_filter() -> None:
    import ctypes

    prog = filter_program(platform.machine())
    blob = b"".join(struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF) for code, jt, jf, k in prog)

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(Prog(len(prog), blob)), 0, 0):
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def set_limits(mem: int, cpu: int, fsize: int) -> None:
    """Address space, CPU seconds, file size; no core files, 64 open files (each pipe or socket buffer is kernel
    memory the address-space limit does not count), no POSIX message-queue bytes."""
    for limit, value in (
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, fsize),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_MSGQUEUE, 0),
    ):
        resource.setrlimit(limit, (value, value))


def _out_of_reach(fd: int, slot: int) -> int:
    """Move a descriptor to the top of the 64 the program may hold, so closing the low ones (os.closerange(3,
    50), a daemon's habit) leaves the verdict's pipe and file alone."""
    if fd != slot:
        posix.dup2(fd, slot)
        posix.close(fd)
    return slot


def run(argv, _exit=posix._exit, _write=posix.write, _read=posix.read, _print=print):
    """Everything the verdict needs is bound here, before the program can rebind anything."""
    program_path, mem, cpu, fsize, token_fd, result_fd = argv[1], *(int(a) for a in argv[2:7])
    token_fd, result_fd = _out_of_reach(token_fd, 63), _out_of_reach(result_fd, 62)
    set_limits(mem, cpu, fsize)
    install_filter()
    with open(program_path) as f:
        code = compile(f.read(), "program.py", "exec")
    main = types.ModuleType("__main__")  # the program's own module: `import __main__` finds the program
    main.__dict__["__builtins__"] = builtins
    # as the reference harnesses run it (HumanEval's and MBPP's `exec(program, {})`): no `__name__` of its own,
    # so `__name__` reads builtins' and an `if __name__ == "__main__":` demo block does not run
    del main.__dict__["__name__"]
    sys.modules["__main__"] = main
    sys.argv = ["program.py"]
    del argv, f
    try:
        exec(code, main.__dict__)
    except BaseException as err:  # SystemExit included: exiting before the tests end is a failure
        try:
            import traceback

            traceback.print_exception(err)
        except BaseException:
            _print(f"{type(err).__name__}: {err}", file=sys.__stderr__)
        finally:
            _exit(1)
    _write(result_fd, _read(token_fd, 64))  # the tests ran to their end: now, and only now, the token
    _exit(0)


if __name__ == "__main__":
    run(sys.argv)
