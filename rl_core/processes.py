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

The death signal is sent when the *thread* that started the child exits, not only the
process; the launcher starts its children from its main thread, and a worker's run is
started by the pool thread that supervises it for the run's whole life.

No torch, no Django: importing this module costs nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys

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
