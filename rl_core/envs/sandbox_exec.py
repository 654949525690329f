"""The launcher inside the Python tool's sandbox: `python -I .../sandbox_exec.py [limits] --workdir DIR`,
or `... --warm --control-fd N` for a launcher that serves many calls (see `_serve`).

`rl_core.envs.sandbox` starts one of these per tool call, or one per concurrent call that it keeps
(in its own session, with a minimal environment), and it confines itself before it runs DIR/main.py. It is run *by path* and imports
only the standard library, so nothing of the worker's import path (the repository, Django) is on
the tool's `sys.path`. The confinement happens here, after exec, rather than in a `preexec_fn`:
the workers are threaded, and Python run between fork and exec in a threaded program can
deadlock on a lock another thread held at fork (the same reason as `rl_core.common.processes`).

In order, each step best effort where the kernel may refuse it:

1. PR_SET_PDEATHSIG: the sandbox dies with the worker.
2. `unshare`: a new network namespace (no interface but a down loopback: no network at all),
   a new PID namespace (the tool's first process is its init: when it exits or is killed the
   kernel kills every process it left, even one that left the process group with `setsid`),
   new IPC and UTS namespaces. As root directly; otherwise inside a new user namespace.
3. fork: the child is the PID namespace's init and runs the code; this process waits for it and
   exits with its status (CPU_LIMIT_EXIT when the CPU rlimit killed it). A warm launcher's init
   instead forks a process per call, which takes steps 4-6, and kills the rest after it.
4. rlimits: CPU seconds, address space, processes (RLIMIT_NPROC: a fork bomb fails to fork),
   file size, no core dumps, open files.
5. When root: drop to the given uid/gid (`nobody`) and no supplementary groups, so that the OS
   denies the run directory, secrets readable only by the worker's user, other users' processes,
   and RLIMIT_NPROC applies (root is exempt from it). Skipped, and reported by `--probe`, when
   that user could not read the Python installation (e.g. a pyenv under a 0700 /root).
6. An audit hook (PEP 578) that refuses, with PermissionError: sockets, subprocesses, fork/exec,
   signals to other processes, ctypes, gc's object walks, rlimit changes, opening or listing
   anything outside the work directory and the Python installation, and writing, renaming,
   removing outside the work directory. `pwd`/`grp` cannot be imported (they read /etc/passwd
   in C, where no audit event fires). An audit hook runs in the same interpreter as the code it
   watches, so it is defence in depth and not a security boundary: code that reaches native
   code (a C extension with a bug, an escaped hook closure) gets around it, and then only the
   OS layers above hold.

Exit status: the code's own; REFUSED_EXIT when it died of an exception after the hook refused
something; CPU_LIMIT_EXIT when RLIMIT_CPU killed it; 128+signal when a signal did.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import sys
import sysconfig
import types

# json (the probe's answer) and traceback (an exception of the code) are imported where they are
# used: this launcher starts once per tool call, and those two imports were ~20 ms of its ~95 ms of CPU.

REFUSED_EXIT = 86
CPU_LIMIT_EXIT = 87

_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1

# Modules whose import is refused (ImportError, so that optional imports in libraries degrade):
# they read the user and group databases in C, below the audit hook.
_DENIED_IMPORTS = frozenset({"pwd", "grp", "spwd"})
# Events refused outright, by exact name or by prefix.
_REFUSED_EVENTS = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "gc.get_referrers", "gc.get_referents", "gc.get_objects",
    "resource.setrlimit", "resource.prlimit", "sys.remote_exec",
})
_REFUSED_PREFIXES = ("socket.", "ctypes.")
# Events that change the file system: every path argument must lie in the work directory.
_WRITE_EVENTS = {
    "os.mkdir": (0,), "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.link": (0, 1),
    "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "os.chflags": (0,), "os.lchflags": (0,),
    "shutil.rmtree": (0,), "shutil.move": (0, 1), "shutil.copyfile": (1,), "shutil.copytree": (1,),
}
_READ_EVENTS = {"os.listdir": 0, "os.scandir": 0, "os.chdir": 0, "os.listxattr": 0, "os.getxattr": 0}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DEVICES_READ = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent and os.getppid() != parent:  # the worker died before the signal was set: nobody would send it
        os._exit(1)


def _unshare() -> dict[str, bool]:
    """New namespaces, the strongest set the kernel allows; which ones took, by name."""
    if not sys.platform.startswith("linux"):
        return {"network": False, "pid": False}
    libc = _libc()
    base = 0 if os.geteuid() == 0 else _CLONE_NEWUSER  # root may unshare directly; others need a user namespace
    for flags, took in (
        (_CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS, {"network": True, "pid": True}),
        (_CLONE_NEWNET | _CLONE_NEWPID, {"network": True, "pid": True}),
        (_CLONE_NEWNET, {"network": True, "pid": False}),
        (_CLONE_NEWPID, {"network": False, "pid": True}),
    ):
        if libc.unshare(base | flags) == 0:
            return took
    return {"network": False, "pid": False}


def _set_limits(cpu_s: int, memory_mb: int, processes: int) -> None:
    # soft == hard: the kernel sends SIGKILL at the hard limit, which even a PID namespace's init
    # gets (SIGXCPU at a lower soft limit would be ignored by an init without a handler).
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (memory, memory))  # one file in the work dir: no bigger than the memory
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def _python_dirs() -> list[str]:
    """The directories of the Python installation the code may read (stdlib, site-packages)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    for entry in sys.path:
        real = os.path.realpath(entry) if entry else ""
        if real and any(real == p or real.startswith(p + os.sep) for p in prefixes):
            dirs.add(real)
    return sorted(d for d in dirs if os.path.isdir(d))


def _can_drop(uid: int, gid: int, readable: list[str]) -> bool:
    """Whether this root process can become uid/gid and that user can still read `readable`."""
    if os.geteuid() != 0 or uid < 0:
        return False
    os.setgroups([])  # none of root's supplementary groups, in the check as after the drop
    os.setegid(gid)
    os.seteuid(uid)
    try:
        return all(os.access(path, os.R_OK | os.X_OK, effective_ids=True) for path in readable)
    finally:
        os.seteuid(0)
        os.setegid(0)


def _drop_privileges(uid: int, gid: int, readable: list[str], checked: bool = False) -> bool:
    """setuid/setgid to uid/gid when root and that user can read `readable` (`checked`: the warm
    launcher asked `_can_drop` once already); False when not dropped."""
    if not checked and not _can_drop(uid, gid, readable):
        return False
    if os.geteuid() != 0 or uid < 0:
        return False
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    return True


def _within(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def _make_hook(workdir: str, read_roots: tuple[str, ...], refusals: list[str]):  # -> Callable[[str, tuple], None]
    write_roots = (workdir,)

    def resolve(path: object) -> str | None:
        if isinstance(path, int) or path is None:
            return None  # an open file descriptor (got through an audited open) or the cwd default
        return os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]

    def refuse(event: str, detail: object) -> None:
        refusals.append(event)
        raise PermissionError(f"sandbox: {event} refused ({detail!r})")

    def hook(event: str, args: tuple) -> None:
        if event == "import":
            if args[0] in _DENIED_IMPORTS:
                raise ImportError(f"sandbox: import of {args[0]} refused")
            return
        if event == "open":
            path = resolve(args[0])
            if path is None:
                return
            mode = args[1] if isinstance(args[1], str) else ""
            flags = args[2] if isinstance(args[2], int) else 0
            writing = any(c in mode for c in "wax+") or bool(flags & _WRITE_FLAGS)
            if writing and not (_within(path, write_roots) or path == "/dev/null"):
                refuse(event, path)
            if not writing and not (_within(path, read_roots) or path in _DEVICES_READ):
                refuse(event, path)
            return
        if event in _READ_EVENTS:
            path = resolve(args[_READ_EVENTS[event]] if args else None)
            if path is not None and not _within(path, read_roots):
                refuse(event, path)
            return
        if event in _WRITE_EVENTS:
            for index in _WRITE_EVENTS[event]:
                path = resolve(args[index]) if len(args) > index else None
                if path is not None and not _within(path, write_roots):
                    refuse(event, path)
            return
        if event in _REFUSED_EVENTS or event.startswith(_REFUSED_PREFIXES):
            refuse(event, args[:1])

    return hook


def _neuter_fork_exec() -> None:
    """`_posixsubprocess.fork_exec` raises no audit event in 3.11; libraries import it at start
    (sympy does), so it cannot be refused at import: the function itself is replaced."""
    import _posixsubprocess

    def fork_exec(*_args: object, **_kwargs: object) -> int:
        raise PermissionError("sandbox: _posixsubprocess.fork_exec refused")

    _posixsubprocess.fork_exec = fork_exec  # type: ignore[attr-defined]


def _run_code(workdir: str, audit_hook: bool, python_dirs: list[str] | None = None) -> int:
    path = os.path.join(workdir, "main.py")
    with open(path, encoding="utf-8") as file:
        source = file.read()
    read_roots = tuple(_python_dirs() if python_dirs is None else python_dirs) + (workdir,)
    sys.path[:] = [workdir] + [entry for entry in sys.path if entry and _within(os.path.realpath(entry), read_roots)]
    sys.dont_write_bytecode = True
    sys.argv = [path]
    # The code gets a fresh __main__ module: the launcher's globals are not handed to it.
    main_module = types.ModuleType("__main__")
    main_module.__file__ = path
    sys.modules["__main__"] = main_module
    refusals: list[str] = []
    if audit_hook:
        for name in _DENIED_IMPORTS:  # imported before the hook (e.g. by os.path.expanduser): the code imports it anew
            sys.modules.pop(name, None)
        _neuter_fork_exec()
        sys.addaudithook(_make_hook(workdir, read_roots, refusals))
    try:
        exec(compile(source, path, "exec"), main_module.__dict__)  # noqa: S102 - running the tool's code is the point
    except SystemExit as stop:
        code = stop.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException as error:  # noqa: BLE001 - any exception of the code is its error, printed as Python would
        try:
            import traceback
        except BaseException:  # noqa: BLE001 - e.g. MemoryError under RLIMIT_AS: the error's line still goes out
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
        else:
            traceback.print_exception(type(error), error, error.__traceback__.tb_next if error.__traceback__ else None)
        return REFUSED_EXIT if refusals else 1
    return 0


def _exit_status(status: int, usage: resource.struct_rusage, cpu_s: int | None) -> int:
    """A waited-for call's exit status as the worker reads it (the module docstring's list)."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    sig = os.WTERMSIG(status)
    # The rlimit counts the scheduler's exact runtime, rusage the tick-sampled one, which can read
    # ~10% lower (0.93 s at a 1 s limit under load): half the limit tells the two kills apart.
    if cpu_s and sig in (signal.SIGKILL, signal.SIGXCPU) and usage.ru_utime + usage.ru_stime >= cpu_s * 0.5:
        return CPU_LIMIT_EXIT
    return 128 + sig


# --- The warm launcher (`--warm`): one per concurrent-call slot of a worker's sandbox --------------
# Starting this launcher costs ~90 ms of CPU (an interpreter, its imports, new namespaces); a fork of
# a started one ~2 ms. So the worker keeps one per slot: it confines itself once as above (network,
# PID, IPC and UTS namespaces; it is the PID namespace's init) and then, per request on its control
# socket, forks a process that sets the call's rlimits, drops to the sandbox user, and runs the code
# with the audit hook. After the call, and when the worker asks (wall-time or output limit), it
# SIGKILLs every other process of its PID namespace, so nothing a call started outlives it, and a
# later call starts from this clean process again (its files went with its directory). It serves
# only where the code runs as another user than itself (root dropping to `nobody`) in a PID
# namespace of its own: otherwise the code could signal or trace it, and kill(-1) would not be
# confined; the worker then starts one launcher per call as before.

def _serve(args: argparse.Namespace, namespaces: dict[str, bool]) -> int:
    """The warm launcher's loop: returns when the worker closes the socket; each call's forked
    process ends in `_exit_now`."""
    import json
    import socket
    import traceback  # noqa: F401 - imported once here for every call's error, not in each call

    control = socket.socket(fileno=args.control_fd)
    dirs = _python_dirs()
    try:
        os.close(os.pidfd_open(os.getpid()))
        pidfds = True
    except (AttributeError, OSError):  # an old kernel: no way to wait for a call and the socket at once
        pidfds = False
    warm = namespaces["pid"] and os.getpid() == 1 and pidfds and _can_drop(args.uid, args.gid, dirs)
    control.sendall(json.dumps({**namespaces, "dropped_privileges": warm, "uid": args.uid if warm else os.getuid(),
                                "warm": warm}).encode())
    if not warm:
        return 0
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, 2)
        except OSError:
            return 0
        if not message:
            return 0  # the worker is gone or done: this init's exit ends the namespace
        request = json.loads(message)
        if request.get("op") != "run" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue  # a kill for a call already over
        child = os.fork()
        if child == 0:
            control.detach()  # its fd is closed below; the object must not close a number the code reuses
            _exit_now(_call(request, fds, dirs, args))
        for fd in fds:
            os.close(fd)
        reply = _watch(control, child, request)
        _kill_the_rest()
        if reply is None:
            return 0
        control.sendall(json.dumps(reply).encode())


def _call(request: dict, fds: list[int], dirs: list[str], args: argparse.Namespace) -> int:
    """In the forked process: the call's output pipes as stdout/stderr, nothing else open, limits,
    the sandbox user, then the code."""
    workdir = os.path.realpath(request["workdir"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.closerange(3, 1 << 16)  # the control socket, the passed pipes' numbers, anything inherited
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    _set_limits(int(request["cpu_s"]), int(request["memory_mb"]), int(request["processes"]))
    if not _drop_privileges(args.uid, args.gid, dirs, checked=True):
        os._exit(1)  # cannot happen after the launcher's check; never run code as root
    os.chdir(workdir)
    os.umask(0o077)
    return _run_code(workdir, audit_hook=not args.no_audit_hook, python_dirs=dirs)


def _exit_now(code: int) -> None:
    """A call's process ends as Python's exit would for what the code can see (its atexit
    functions, its non-daemon threads joined, its output flushed), without finalizing the
    interpreter it shares with the launcher: that teardown was ~20 ms of a ~30 ms call."""
    import atexit

    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # what Py_Finalize calls first: joins the non-daemon threads
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - a closed or broken stream: nothing more to say
                pass
        os._exit(code)


def _watch(control, child: int, request: dict) -> dict | None:  # noqa: ANN001 - a socket.socket (imported in _serve)
    """Waits for the call's process to exit, killing it when the worker says so; its reply, or None
    when the worker closed the socket."""
    import json  # already loaded by _serve: a lookup, not an import
    import select

    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    try:
        while True:
            for fd, _ in poller.poll():
                if fd == pidfd:
                    _, status, usage = os.wait4(child, 0)
                    return {"call": request["call"], "exit": _exit_status(status, usage, int(request["cpu_s"]))}
                message = control.recv(4096)
                if not message:
                    return None
                if json.loads(message).get("op") == "kill":
                    os.kill(child, signal.SIGKILL)
    finally:
        os.close(pidfd)


def _kill_the_rest() -> None:
    """SIGKILL every process of this PID namespace but its init (this process), and reap them."""
    if os.getpid() != 1:
        return  # never: outside its own PID namespace kill(-1) would reach every process it may signal
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return  # nothing left
        while True:  # a dying process's children are reparented here before it can be reaped
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandbox_exec.py", description="Confine this process, then run WORKDIR/main.py.")
    parser.add_argument("--workdir", help="the private temporary directory: cwd, the only writable place (not with --warm)")
    parser.add_argument("--parent", type=int, required=True, help="the worker's pid, checked to be this process's parent (0: no check); the sandbox dies with its parent")
    parser.add_argument("--cpu-s", type=int, help="RLIMIT_CPU seconds (not with --warm: per request)")
    parser.add_argument("--memory-mb", type=int, help="RLIMIT_AS in MiB (not with --warm: per request)")
    parser.add_argument("--processes", type=int, help="RLIMIT_NPROC (not with --warm: per request)")
    parser.add_argument("--uid", type=int, default=-1, help="when root: the uid to drop to (-1: stay)")
    parser.add_argument("--gid", type=int, default=-1, help="when root: the gid to drop to")
    parser.add_argument("--no-audit-hook", action="store_true", help="tests only: show what the OS layers hold alone")
    parser.add_argument("--probe", action="store_true", help="confine, then print which layers took as JSON instead of running code")
    parser.add_argument("--warm", action="store_true", help="serve calls from the worker on --control-fd (see _serve)")
    parser.add_argument("--control-fd", type=int, default=-1, help="with --warm: the worker's end of a SOCK_SEQPACKET socket pair")
    args = parser.parse_args(argv)
    if args.warm and args.control_fd < 0:
        parser.error("--warm needs --control-fd")
    if not args.warm and None in (args.workdir, args.cpu_s, args.memory_mb, args.processes):
        parser.error("--workdir, --cpu-s, --memory-mb and --processes are required without --warm")
    _die_with_parent(args.parent)
    namespaces = _unshare()
    child = os.fork()  # in a new PID namespace only children enter it: the child is its init
    if child:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides how the sandbox stops
        _, status, usage = os.wait4(child, 0)
        return _exit_status(status, usage, args.cpu_s)
    if args.warm:
        _die_with_parent(0)  # this init dies with the launcher above it, and so the namespace
        return _serve(args, namespaces)
    workdir = os.path.realpath(args.workdir)
    _set_limits(args.cpu_s, args.memory_mb, args.processes)
    dropped = _drop_privileges(args.uid, args.gid, [*_python_dirs(), workdir])
    os.chdir(workdir)
    os.umask(0o077)
    if args.probe:
        import json

        print(json.dumps({**namespaces, "dropped_privileges": dropped, "uid": os.getuid()}))
        return 0
    # Returned to sys.exit as usual: the code's atexit handlers run and its output is flushed.
    return _run_code(workdir, audit_hook=not args.no_audit_hook)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
