"""The sandbox in which a policy's Python tool calls run during multi-turn math RL.

`ProcessSandbox.run(code, limits)` runs `code` in a fresh process and always returns a
`ToolResult`: whatever the code does (loops forever, forks without end, prints 10 GB, reads
/etc/passwd, connects somewhere, writes outside its directory) the caller gets a status other
than "ok" and goes on. Per call:

- a private temporary directory, the code's cwd and its only writable place, removed afterwards;
- a minimal environment (no variable of the worker's: DATABASE_URL, tokens, ...);
- at the wall-time limit, at the output limit, and after it exits, every process it started gets
  SIGKILL: its launcher's whole process group (`os.killpg`), or with a warm launcher every process
  of the launcher's PID namespace but the launcher;
- stdout and stderr read as they come, `output_bytes` kept in all; more is an "output_limit";
- inside, `sandbox_exec` (the launcher, see its docstring) adds a network namespace (no network),
  a PID namespace (nothing outlives the call, not even a `setsid` escapee), rlimits (CPU seconds,
  address space, processes, file size), privileges dropped to `nobody` when the worker is root,
  and an audit hook refusing sockets, subprocesses, ctypes, and files outside its directory and
  the Python installation.

Each call is a new process either way: by default forked from a *warm launcher* (one started and
confined per concurrent call, kept between calls: ~10 ms of CPU a call instead of ~100 ms for a
launcher started per call; `sandbox_exec._serve` says when it applies). Calls run concurrently
(asyncio pipes and sockets, so a slow tool never blocks the event loop), with a semaphore (one per
event loop) capping how many run at once.

What it protects against: the policy's mistakes and ordinary mischief (resource exhaustion,
reading the worker's secrets, the run directory or the database, network access, leftovers).
What not: kernel exploits and CPU side channels (same kernel, same cores); and where the kernel
refuses namespaces and the worker cannot drop root (see `probe_isolation`), code that gets past
the audit hook with native code — audit hooks live in the interpreter they watch and are not a
security boundary. Where that matters, put a stronger sandbox (gVisor's runsc, nsjail, bubblewrap,
a container runtime) behind the same `Sandbox` protocol: `CommandSandbox` runs the same launcher
under a configurable command prefix.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Literal, Protocol, Sequence

from rl_core.envs import sandbox_exec

logger = logging.getLogger(__name__)
LAUNCHER = os.path.abspath(sandbox_exec.__file__)
ToolStatus = Literal["ok", "error", "timeout", "output_limit", "refused"]
_READ_CHUNK = 65536
# The code's whole environment. HOME and TMPDIR point into its directory; one BLAS thread each,
# because threads count against RLIMIT_NPROC and each reserves address space against RLIMIT_AS.
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class SandboxLimits:
    """What one tool call may use; the defaults are the env section's defaults."""

    wall_s: float = 5.0  # wall-time limit; every process of the call is killed at it
    cpu_s: int = 5  # RLIMIT_CPU
    memory_mb: int = 512  # RLIMIT_AS
    output_bytes: int = 16_384  # stdout+stderr kept; more is cut and the call is an error ("output_limit")
    processes: int = 32  # RLIMIT_NPROC-style cap (fork bombs)


@dataclass(frozen=True)
class ToolResult:
    status: ToolStatus  # anything but "ok" is a tool error
    stdout: str
    stderr: str
    seconds: float
    exit_code: int | None  # None when the sandbox killed it (wall time, output limit)


class Sandbox(Protocol):
    async def run(self, code: str, limits: SandboxLimits) -> ToolResult: ...


@dataclass(frozen=True)
class Isolation:
    """Which of the launcher's OS layers take on this machine (the audit hook always does)."""

    network: bool  # a new network namespace: no network at all
    pid: bool  # a new PID namespace: nothing outlives the call
    dropped_privileges: bool  # root dropped to the sandbox user (False when not root, or it cannot read Python)
    uid: int  # the uid the code runs as


class _Output:
    """stdout and stderr as read, `limit` bytes kept in all; `exceeded` is set past it."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.exceeded = asyncio.Event()

    async def drain(self, stream: asyncio.StreamReader | None, sink: bytearray) -> None:
        while stream is not None and (chunk := await stream.read(_READ_CHUNK)):
            keep = min(len(chunk), self.left)
            sink += chunk[:keep]
            self.left -= keep
            if keep < len(chunk):
                self.exceeded.set()
                return


_REAP_S = 10.0  # after the SIGKILL: the pipes' ends and the exit status come within this


async def _discard(stream: asyncio.StreamReader | None) -> None:
    while stream is not None and await stream.read(_READ_CHUNK):
        pass


async def _reap(process: asyncio.subprocess.Process) -> None:
    """The killed group's rest of output read away, then its exit. A stream left unread past the
    output limit has its transport paused: the closed pipe's end is never seen, and Python 3.11's
    `wait()` waits for the pipes as well as the exit, forever (the 10 GB test hung so in a loaded
    suite). Bounded either way: the group is SIGKILLed, the event loop's child watcher reaps it."""
    for step in (asyncio.gather(_discard(process.stdout), _discard(process.stderr)), process.wait()):
        try:
            await asyncio.wait_for(step, timeout=_REAP_S)
        except asyncio.TimeoutError:
            logger.warning("sandbox: pid %s not reaped within %.0f s of its SIGKILL", process.pid, _REAP_S)
            return


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


def _status_of(exit_code: int) -> ToolStatus:
    if exit_code == 0:
        return "ok"
    if exit_code == sandbox_exec.REFUSED_EXIT:
        return "refused"
    if exit_code == sandbox_exec.CPU_LIMIT_EXIT:
        return "timeout"
    return "error"


def _result(output: _Output, in_time: bool, exit_code: int | None, limits: SandboxLimits, stdout: bytearray,
            stderr: bytearray, started: float) -> ToolResult:
    """One call's ToolResult from how it ended: past the output limit, past the wall time (not
    `in_time`), or with `exit_code`."""
    status: ToolStatus
    if output.exceeded.is_set():
        status, exit_code = "output_limit", None
    elif not in_time:
        status, exit_code = "timeout", None
    else:
        assert exit_code is not None
        status = _status_of(exit_code)
    note = ""
    if status == "timeout" and exit_code is None:
        note = f"sandbox: wall-time limit ({limits.wall_s:g} s) reached\n"
    elif exit_code == sandbox_exec.CPU_LIMIT_EXIT:
        note = f"sandbox: CPU time limit ({limits.cpu_s} s) reached\n"
    if note:
        stderr += (b"\n" if stderr and not stderr.endswith(b"\n") else b"") + note.encode()
    return ToolResult(status=status, stdout=stdout.decode("utf-8", errors="replace"),
                      stderr=stderr.decode("utf-8", errors="replace"), seconds=time.monotonic() - started,
                      exit_code=exit_code)


@dataclass
class _WarmLauncher:
    """A started `sandbox_exec.py --warm` (see `_serve` there) and the worker's end of its socket."""

    process: subprocess.Popen[bytes]
    control: socket.socket
    calls: itertools.count = field(default_factory=itertools.count)


def _close_launcher(launcher: _WarmLauncher) -> None:
    """Closes the socket (the launcher's loop ends), SIGKILLs its group (and so its namespace), reaps it."""
    launcher.control.close()
    _kill_group(launcher.process.pid)
    try:
        launcher.process.wait(timeout=_REAP_S)
    except subprocess.TimeoutExpired:
        logger.warning("sandbox: warm launcher %s not reaped within %.0f s of its SIGKILL", launcher.process.pid, _REAP_S)


def _close_launchers(launchers: list[_WarmLauncher]) -> None:
    while launchers:
        _close_launcher(launchers.pop())


async def _pipe_reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                os.fdopen(fd, "rb", buffering=0))
    return reader, transport


class _LauncherLost(Exception):
    """The warm launcher stopped answering (it died, or its socket broke) during a call."""


def _usable_by_anyone(path: str) -> bool:
    """Whether a user with no ownership of `path` can read and run it: every directory on its real
    path searchable by others, the file itself readable and executable by others."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    try:
        for depth in range(2, len(parts)):
            if not os.stat(os.sep.join(parts[:depth])).st_mode & 0o001:
                return False
        return os.stat(real).st_mode & 0o005 == 0o005
    except OSError:
        return False


@functools.lru_cache(maxsize=None)
def default_python() -> str:
    """The interpreter tool code runs under: this one, unless the worker is root and the sandbox
    user could not read it (a pyenv Python under /root, as on the CI machine: privileges would
    then stay root), in which case the system's `/usr/bin/python3` when others can run it. Tool
    code imports what that interpreter has: the standard library at least."""
    if os.geteuid() != 0 or _usable_by_anyone(sys.executable):
        return sys.executable
    system = "/usr/bin/python3"
    return system if os.path.exists(system) and _usable_by_anyone(system) else sys.executable


class ProcessSandbox:
    """The default `Sandbox`: a confined local process per call (see the module docstring).

    `python`: the interpreter the code runs under (its site-packages are what the code can
    import; the sandbox user must be able to read it for privileges to be dropped; None:
    `default_python()`).
    `user`: when the worker is root, the user the code runs as (None: stay root).
    `audit_hook`: False only in tests that check what the OS layers hold alone.
    `warm`: keep a started launcher per concurrent call and fork each call from it (~2 ms of CPU
    instead of ~90 ms; `sandbox_exec._serve` says how and when it applies: where it does not, as
    without root, each call starts a launcher). Each call is confined the same either way; call
    `aclose()` when done (a collected sandbox also closes its launchers)."""

    def __init__(self, max_concurrent: int = 4, *, python: str | None = None, user: str | None = "nobody",
                 audit_hook: bool = True, warm: bool = True) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self.python = python or default_python()
        self.audit_hook = audit_hook
        self.warm = warm
        # Launchers not in a call; shared by every event loop that uses this sandbox (a thread's lock
        # guards it), closed when the sandbox is collected or closed.
        self._idle: list[_WarmLauncher] = []
        self._idle_lock = threading.Lock()
        self._closer = weakref.finalize(self, _close_launchers, self._idle)
        self._ids = (-1, -1)
        if user is not None and os.geteuid() == 0:
            entry = pwd.getpwnam(user)
            self._ids = (entry.pw_uid, entry.pw_gid)
        # asyncio primitives belong to one loop; a sandbox shared by several loops caps each.
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def command(self, workdir: str, limits: SandboxLimits, *, probe: bool = False) -> list[str]:
        """The launcher's command line for one call in `workdir`."""
        command = [
            self.python, "-I", LAUNCHER, "--workdir", workdir, "--parent", str(self._parent()),
            "--cpu-s", str(limits.cpu_s), "--memory-mb", str(limits.memory_mb), "--processes", str(limits.processes),
            "--uid", str(self._ids[0]), "--gid", str(self._ids[1]),
        ]
        if not self.audit_hook:
            command.append("--no-audit-hook")
        if probe:
            command.append("--probe")
        return command

    def _parent(self) -> int:
        """The pid the launcher checks is its parent (so that it dies with the worker)."""
        return os.getpid()

    def _workdir(self, code: str) -> str:
        workdir = tempfile.mkdtemp(prefix="inflight-sandbox-")  # 0700
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as file:
            file.write(code)
        if self._ids[0] >= 0:
            os.chown(workdir, *self._ids)
            os.chown(os.path.join(workdir, "main.py"), *self._ids)
        return workdir

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores[loop] = asyncio.Semaphore(self.max_concurrent)
        return self._semaphores[loop]

    async def run(self, code: str, limits: SandboxLimits) -> ToolResult:
        async with self._semaphore():
            workdir = self._workdir(code)
            try:
                launcher = await self._take_launcher() if self.warm else None
                if launcher is None:
                    return await self._run_in(workdir, limits)
                started = time.monotonic()
                try:
                    return await self._run_warm(launcher, workdir, limits)
                except (_LauncherLost, OSError) as lost:
                    # The code may have run in part: an error the policy sees, not a silent rerun.
                    logger.warning("sandbox: %s", lost)
                    return ToolResult(status="error", stdout="", stderr=f"sandbox: the call's process was lost ({lost})\n",
                                      seconds=time.monotonic() - started, exit_code=None)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

    async def aclose(self) -> None:
        """Stops the warm launchers (the env's `aclose` calls this when a run's actor stops)."""
        with self._idle_lock:
            launchers, self._idle[:] = list(self._idle), []
        for launcher in launchers:
            await asyncio.to_thread(_close_launcher, launcher)

    async def _take_launcher(self) -> _WarmLauncher | None:
        """An idle warm launcher, or a new one; None where the machine gives none (then `warm` goes off)."""
        while True:
            with self._idle_lock:
                launcher = self._idle.pop() if self._idle else None
            if launcher is None:
                break
            if launcher.process.poll() is None:
                return launcher
            # Dead while idle: e.g. killed with the thread that started it (PR_SET_PDEATHSIG follows
            # the parent thread, not the process), or by an operator.
            logger.warning("sandbox: warm launcher %s had exited (%s); starting another", launcher.process.pid,
                           launcher.process.returncode)
            launcher.control.close()
        worker_end, launcher_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [self.python, "-I", LAUNCHER, "--warm", "--control-fd", str(launcher_end.fileno()),
                   "--parent", str(self._parent()), "--uid", str(self._ids[0]), "--gid", str(self._ids[1])]
        if not self.audit_hook:
            command.append("--no-audit-hook")
        try:
            # stderr stays the worker's: a launcher's own failure is in the actor's log (each call's
            # process has its own pipes before any code runs).
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       pass_fds=[launcher_end.fileno()], cwd="/", env={**_BASE_ENV, "HOME": "/"},
                                       start_new_session=True)
        finally:
            launcher_end.close()
        worker_end.setblocking(False)
        launcher = _WarmLauncher(process, worker_end)
        try:
            ready = json.loads(await asyncio.wait_for(asyncio.get_running_loop().sock_recv(worker_end, 4096), 30.0) or b"{}")
        except (TimeoutError, ValueError, OSError) as error:
            ready = {"error": repr(error)}
        if ready.get("warm"):
            return launcher
        await asyncio.to_thread(_close_launcher, launcher)
        if "warm" in ready:  # it answered: this machine or user gives none, for good
            logger.info("sandbox: no warm launcher here (%s); one launcher per call", ready)
            self.warm = False
        else:
            logger.warning("sandbox: a warm launcher did not start (%s); this call gets one of its own", ready)
        return None

    async def _run_warm(self, launcher: _WarmLauncher, workdir: str, limits: SandboxLimits) -> ToolResult:
        """One call through a warm launcher: the same limits, outcome and ToolResult as `_run_in`."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        call = next(launcher.calls)
        request = {"op": "run", "call": call, "workdir": workdir, "cpu_s": limits.cpu_s,
                   "memory_mb": limits.memory_mb, "processes": limits.processes}
        pipes = [os.pipe(), os.pipe()]
        transports: list[asyncio.BaseTransport] = []
        pending: list[asyncio.Future] = []
        try:
            try:
                socket.send_fds(launcher.control, [json.dumps(request).encode()], [pipes[0][1], pipes[1][1]])
            finally:
                for _, write_end in pipes:
                    os.close(write_end)
            readers = []
            for read_end, _ in pipes:
                reader, transport = await _pipe_reader(read_end)
                readers.append(reader)
                transports.append(transport)
            output = _Output(limits.output_bytes)
            stdout, stderr = bytearray(), bytearray()
            reply = asyncio.ensure_future(loop.sock_recv(launcher.control, 4096))
            drained = asyncio.ensure_future(asyncio.gather(output.drain(readers[0], stdout), output.drain(readers[1], stderr)))
            over = asyncio.ensure_future(output.exceeded.wait())
            pending += [reply, drained, over]
            try:
                done, _ = await asyncio.wait({reply, over}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
                in_time = reply in done and not output.exceeded.is_set()
                if not in_time:
                    await loop.sock_sendall(launcher.control, json.dumps({"op": "kill", "call": call}).encode())
                answer = await asyncio.wait_for(asyncio.shield(reply), timeout=_REAP_S)
            finally:
                over.cancel()
            if not answer:
                raise _LauncherLost(f"warm launcher {launcher.process.pid} closed its socket")
            exit_code = json.loads(answer)["exit"]
            # Every process of the call is dead now: the pipes' ends come at once (bounded all the same).
            try:
                await asyncio.wait_for(asyncio.shield(drained), timeout=_REAP_S)
            except TimeoutError:
                raise _LauncherLost(f"a call of warm launcher {launcher.process.pid} left its output open") from None
            if output.exceeded.is_set():
                await asyncio.gather(*(_discard(r) for r in readers))
        except BaseException:
            # A launcher in an unknown state (lost, or this call cancelled) is never reused.
            for future in pending:
                future.cancel()
            await asyncio.shield(asyncio.to_thread(_close_launcher, launcher))
            raise
        finally:
            for transport in transports:
                transport.close()
        with self._idle_lock:
            self._idle.append(launcher)
        return _result(output, in_time, exit_code, limits, stdout, stderr, started)

    async def _run_in(self, workdir: str, limits: SandboxLimits) -> ToolResult:
        """One call in a launcher started for it."""
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *self.command(workdir, limits), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=workdir, env={**_BASE_ENV, "HOME": workdir, "TMPDIR": workdir}, start_new_session=True)
        output = _Output(limits.output_bytes)
        stdout, stderr = bytearray(), bytearray()

        async def finish() -> int:
            await asyncio.gather(output.drain(process.stdout, stdout), output.drain(process.stderr, stderr))
            return await process.wait()

        finished = asyncio.ensure_future(finish())
        over = asyncio.ensure_future(output.exceeded.wait())
        try:
            await asyncio.wait({finished, over}, timeout=limits.wall_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Always: at a limit this is the kill; after a clean exit it takes whatever the code left.
            _kill_group(process.pid)
            over.cancel()
            if not finished.done():
                finished.cancel()
            await _reap(process)
        in_time = finished.done() and not finished.cancelled()
        return _result(output, in_time, finished.result() if in_time else None, limits, stdout, stderr, started)

    def probe(self) -> Isolation:
        """Which OS layers the launcher gets on this machine (a process started for it)."""
        workdir = self._workdir("")
        try:
            done = subprocess.run(self.command(workdir, SandboxLimits(), probe=True), capture_output=True, text=True,
                                  cwd=workdir, env={**_BASE_ENV, "HOME": workdir}, timeout=30, check=True,
                                  start_new_session=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return Isolation(**json.loads(done.stdout))


class CommandSandbox(ProcessSandbox):
    """The launcher run under an operator's command prefix: a stronger sandbox behind the same
    protocol, e.g. `["nsjail", "--quiet", "--mode", "o", "--chroot", "/", "--bindmount", "{workdir}",
    "--"]` or `["runsc", "do", "--"]`. `{workdir}` in an argument is replaced by the call's
    directory, which the prefix must leave visible and writable at the same path. The launcher's
    own layers still apply inside, as far as the outer sandbox lets them."""

    def __init__(self, prefix: Sequence[str], max_concurrent: int = 4, **kwargs: object) -> None:
        if not prefix:
            raise ValueError("CommandSandbox needs a command prefix (use ProcessSandbox for none)")
        super().__init__(max_concurrent, **kwargs)  # type: ignore[arg-type]
        self.prefix = list(prefix)
        self.warm = False  # the prefix wraps each call's own launcher (its `{workdir}` is the call's)

    def _parent(self) -> int:
        return 0  # the launcher's parent is the prefix's process (or what it execs): no pid to check

    def command(self, workdir: str, limits: SandboxLimits, *, probe: bool = False) -> list[str]:
        return [part.replace("{workdir}", workdir) for part in self.prefix] + super().command(workdir, limits, probe=probe)


@functools.cache
def probe_isolation(python: str | None = None) -> Isolation:
    """`ProcessSandbox(python=python).probe()`, once per process: for a startup log line and tests."""
    return ProcessSandbox(python=python).probe()


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> ToolResult:
    """Synchronous `ProcessSandbox().run` (tests, evaluation). From a thread whose event loop is
    running, the call runs on a loop of its own in a helper thread rather than failing."""
    def call() -> ToolResult:
        # warm=False: for one call a launcher of its own costs less than starting and closing a warm one.
        return asyncio.run(ProcessSandbox(max_concurrent=1, warm=False).run(code, limits))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()
