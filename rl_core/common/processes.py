"""Process plumbing shared by the launcher, the engine and the platform's worker.

- `free_port`: a TCP port the OS says is free now (servers, torch.distributed rendezvous).
- `die_with_parent`: the command prefixed so that the child gets SIGTERM when its parent
  dies (Linux PR_SET_PDEATHSIG), with no `preexec_fn`. `preexec_fn` runs Python between
  fork and exec, which the subprocess docs call unsafe in a program with threads (a lock
  held by another thread at fork stays locked in the child forever) — and the Celery
  workers run threaded. Instead the child first runs this module (`python -m
  rl_core.common.processes --parent PID [--ignore-sigint] -- COMMAND...`), which sets the signal
  and then execs COMMAND in the same process: the pid, the process group and the
  signal setting carry over to COMMAND.
- `stop_process_groups`: SIGTERM, a grace period, then SIGKILL to process groups (each child
  started with `start_new_session=True`, so one signal reaches its children too): the
  platform's worker (a cancelled run, a dead worker's engine) and the demo's children. The
  shared-memory segments Python's multiprocessing made in those groups (vLLM's message queues:
  ~420 MB of /dev/shm per server) are removed once nothing maps them: a SIGKILL also kills the
  resource tracker that would have removed them, and /dev/shm is RAM.
- `output_to_log`: a forked child's stdin, stdout and stderr pointed where a fresh child's would be
  (a run's forked roles, the bench smoke's forked benches).
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
import io
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Coroutine, Iterable, Protocol, TypeVar

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def die_with_parent(command: list[str], *, ignore_sigint: bool = False, python: str = sys.executable) -> list[str]:
    """`command` run so that it gets SIGTERM when this process (its parent) dies.
    `ignore_sigint`: Ctrl-C on the terminal reaches the whole foreground group; a child
    that ignores it leaves the decision of how to stop to its parent."""
    prefix = [python, "-m", "rl_core.common.processes", "--parent", str(os.getpid())]
    if ignore_sigint:
        prefix.append("--ignore-sigint")
    return [*prefix, "--", *command]


class GroupLeader(Protocol):
    """A process started in its own session (`start_new_session=True`): its pid is its group's
    id. `poll()` is None while it runs (subprocess.Popen, or a wrapper around a pid)."""

    pid: int

    def poll(self) -> int | None: ...


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):  # gone already, or not ours to signal
        return False


def stop_process_groups(leaders: Iterable[GroupLeader], timeout_s: float, *, kill_wait_s: float = 10.0,
                        poll_s: float = 0.1, kill_orphans: bool = False) -> list[int]:
    """SIGTERM to the group of every leader still running, wait up to `timeout_s` (for all of
    them together) until they exit, then SIGKILL the groups of those still running and wait up
    to `kill_wait_s` more. Returns the pids that needed SIGKILL (the caller says so in its log).

    `kill_orphans`: at the end, SIGKILL every leader's group even when the leader has exited,
    so that children it left behind (a launcher's, a vLLM server's engine core) do not outlive
    it. Only for leaders this process started: a foreign pid that has exited may be reused."""
    leaders = list(leaders)
    running = [leader for leader in leaders if leader.poll() is None]
    segments = multiprocessing_segments({leader.pid for leader in leaders})
    needed_kill: list[int] = []
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, kill_wait_s)):
        if sig == signal.SIGKILL:
            needed_kill = [leader.pid for leader in running]
        running = [leader for leader in running if _signal_group(leader.pid, sig)]
        deadline = time.monotonic() + wait_s
        while (running := [leader for leader in running if leader.poll() is None]) and time.monotonic() < deadline:
            time.sleep(poll_s)
        if not running:
            break
    if kill_orphans:
        for leader in leaders:
            _signal_group(leader.pid, signal.SIGKILL)
    if segments:
        # A leader that has exited may leave its group's other members (a vLLM server's engine core)
        # still dying and still mapping the segments: swept now, those were skipped as in use and
        # then outlived everyone (`bench/weight_update_vllm.py --smoke` left ~420 MB of /dev/shm in
        # some runs). Wait, up to `kill_wait_s`, until the groups are empty.
        pgids = {leader.pid for leader in leaders}
        deadline = time.monotonic() + kill_wait_s
        while _pids_of_groups(pgids) and time.monotonic() < deadline:
            time.sleep(poll_s)
        remove_unmapped_segments(segments)
    return needed_kill


# Names Python's multiprocessing gives what it creates in /dev/shm: `shared_memory.SharedMemory`
# (psm_*) and its semaphores (sem.mp-*). Only these are swept: other /dev/shm files (PostgreSQL's,
# the same-device weight handoff's) have owners of their own that remove them.
_MULTIPROCESSING_SEGMENT_PREFIXES = ("psm_", "sem.mp-")
_SHM = "/dev/shm/"


def _mapped_shm_files(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split(None, 5)[5].strip() for line in maps if _SHM in line and len(line.split(None, 5)) == 6}
    except OSError:  # gone, or not ours to read
        return set()


def _pids_of_groups(pgids: set[int]) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) in pgids:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def multiprocessing_segments(pgids: set[int]) -> set[str]:
    """The multiprocessing segments (`/dev/shm/psm_*`, `sem.mp-*`) mapped now by any process of
    these process groups. Linux only (/proc); elsewhere, nothing."""
    if not pgids or not os.path.isdir("/proc"):
        return set()
    found: set[str] = set()
    for pid in _pids_of_groups(pgids):
        found |= {path for path in _mapped_shm_files(pid) if os.path.basename(path).startswith(_MULTIPROCESSING_SEGMENT_PREFIXES)}
    return found


def remove_unmapped_segments(segments: set[str]) -> list[str]:
    """Unlink each of `segments` that no live process maps any more; the ones removed."""
    if not segments:
        return []
    still_mapped: set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            still_mapped |= _mapped_shm_files(int(entry)) & segments
    removed = []
    for path in sorted(segments - still_mapped):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:  # its owner removed it on the way out
            pass
        except OSError:
            pass
    return removed


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


def output_to_log(log_file: str | Path, append: bool = True) -> None:
    """In a forked child: stdin from /dev/null, stdout and stderr (file descriptors 1 and 2, and
    Python's objects on them) appended to `log_file` — or written from its start with
    `append=False` — unbuffered, as a fresh `PYTHONUNBUFFERED=1` child started with its output
    redirected there would write them."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True,
                                  errors="backslashreplace")
    os.environ["PYTHONUNBUFFERED"] = "1"


def set_parent_death_signal(parent_pid: int) -> None:
    """SIGTERM this process when `parent_pid` (its parent now) dies; exit at once if it died already."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the signal was set: nobody would send it
        os._exit(1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core.common.processes", description="Exec COMMAND; SIGTERM it when PARENT dies.")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--ignore-sigint", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # SIG_IGN survives exec
    set_parent_death_signal(args.parent)
    os.execvp(command[0], command)
    return 127  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
