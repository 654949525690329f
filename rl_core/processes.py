"""Process plumbing shared by the launcher, the engine and the platform's worker.

- `free_port`: a TCP port the OS says is free now (servers, torch.distributed rendezvous).
- `die_with_parent`: the command prefixed so that the child gets SIGTERM when its parent
  dies (Linux PR_SET_PDEATHSIG), with no `preexec_fn`. `preexec_fn` runs Python between
  fork and exec, which the subprocess docs call unsafe in a program with threads (a lock
  held by another thread at fork stays locked in the child forever) — and the Celery
  workers run threaded. Instead the child first runs this module (`python -m
  rl_core.processes --parent PID [--ignore-sigint] -- COMMAND...`), which sets the signal
  and then execs COMMAND in the same process: the pid, the process group and the
  signal setting carry over to COMMAND.
- `start_server_process`: an inference server command (reference or vLLM) started in its own
  process group, waited for until it prints its ready line (`run_dir.parse_ready_line`);
  `ServerProcess.stop` ends the whole group (vLLM's engine-core and worker children too).
- `freeze_startup_objects` and `run_event_loop`: what a run's long-lived processes (server,
  trainer, actor) do once they are loaded, so that the interpreter costs less per step.

The death signal is sent when the *thread* that started the child exits, not only the
process; the launcher starts its children from its main thread, and a worker's run is
started by the pool thread that supervises it for the run's whole life.

No torch, no Django: importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Coroutine, TypeVar

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def die_with_parent(command: list[str], *, ignore_sigint: bool = False, python: str = sys.executable) -> list[str]:
    """`command` run so that it gets SIGTERM when this process (its parent) dies.
    `ignore_sigint`: Ctrl-C on the terminal reaches the whole foreground group; a child
    that ignores it leaves the decision of how to stop to its parent."""
    prefix = [python, "-m", "rl_core.processes", "--parent", str(os.getpid())]
    if ignore_sigint:
        prefix.append("--ignore-sigint")
    return [*prefix, "--", *command]


@dataclass
class ServerProcess:
    """A server started by `start_server_process`: its URL once ready, and every line it printed."""

    url: str
    process: subprocess.Popen
    output: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL the process group (a server's own children too)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        else:
            try:  # the server is gone; its children must not outlive it
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_server_process(command: list[str], timeout_s: float = 600.0, env: dict[str, str] | None = None, what: str = "server") -> ServerProcess:
    """Start a server command in its own process group and wait for its ready line.
    Raises RuntimeError with the end of its output if it exits or times out first."""
    # Imported here: the die_with_parent trampoline imports this module before every exec.
    from rl_core.run_dir import parse_ready_line

    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, start_new_session=True)
    handle = ServerProcess(url="", process=process)
    ready: list[str] = []

    def pump() -> None:
        # Drain the pipe for the server's whole life so it never blocks on a full pipe.
        assert process.stdout is not None
        for line in process.stdout:
            handle.output.append(line)
            url = parse_ready_line(line)
            if url is not None and not ready:
                ready.append(url)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not ready:
        if process.poll() is not None or time.monotonic() > deadline:
            handle.stop()
            raise RuntimeError(f"{what} did not start (rc={process.poll()}):\n{''.join(handle.output)[-4000:]}")
        time.sleep(0.05)
    handle.url = ready[0]
    return handle


def freeze_startup_objects() -> None:
    """Move everything alive now (torch, transformers, the model: ~370,000 objects) out of the
    cyclic garbage collector's reach. Call it once a process is loaded. Otherwise each full
    collection walks them all while holding the GIL: in the demo's server that stalled the decode
    loop for 100-240 ms, 3-4 times per 40 steps (gc.callbacks timings; ~3 ms each once frozen).
    Frozen objects are still freed by reference counting; only cycles among them are not."""
    gc.collect()
    gc.freeze()


_Result = TypeVar("_Result")


def run_event_loop(main: Coroutine[Any, Any, _Result]) -> _Result:
    """`asyncio.run` on uvloop where it is installed (a dependency on Linux and macOS): the
    server's HTTP handling and the actor's many concurrent requests cost less CPU on it, and on a
    2-core machine that CPU is taken from decoding and training (bench/RESULTS.md)."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows, where uvloop does not exist
        return asyncio.run(main)
    return uvloop.run(main)


def _set_parent_death_signal(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the signal was set: nobody would send it
        os._exit(1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core.processes", description="Exec COMMAND; SIGTERM it when PARENT dies.")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--ignore-sigint", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # SIG_IGN survives exec
    _set_parent_death_signal(args.parent)
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
