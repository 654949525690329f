"""A web node: `inflight.asgi:application` served by several Daphne processes on one port.

    python -m inflight.web.node --bind 0.0.0.0 --port 8000 [--processes N] [-- DAPHNE_OPTION ...]

Why more than one: a Daphne process pushes to every open page from one event loop, and renders
the pages' requests (panel.json, the Rollouts tab's lists, snapshots) on threads that share its one
GIL, so one process uses at most one core however many the machine has (bench/platform_scale.py,
40 live runs and 1,500 open pages on two cores: push p95 19.1 s and 665 of 1,500 pages' series
complete with one process, 2.0 s and all of them with two; bench/RESULTS.md, 2026-11-29).

How: this process opens one listening socket per child on the same port (SO_REUSEPORT: the kernel
spreads new connections evenly over them) and starts `--processes` Daphne children, each on its
own (Daphne's `--fd`). A child that dies has its socket closed, so the others take every new
connection while it is started again (its pages reconnect, as they do after any lost socket). The
children get SIGTERM if this process dies (`die_with_parent`); SIGTERM or Ctrl-C here stops them.
Only the first child sweeps for dead workers (`INFLIGHT_WEB_SWEEPER`): one sweep per node is enough.
The node's database pool (`INFLIGHT_DB_POOL_MAX`, 32 by default) is split between its processes (at
least 4 each): a node holds as many PostgreSQL connections with one process as with four.

It is what `manage.py demo`, docker-compose and bench/platform_scale.py start; `python -m daphne`
alone is still one process (the tests' servers).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from types import FrameType

from rl_core.common.processes import die_with_parent

logger = logging.getLogger("inflight.web.node")

APPLICATION = "inflight.asgi:application"
DEFAULT_MAX_PROCESSES = 4  # the default count's cap: beyond it each process's share of the pool gets small
LISTEN_BACKLOG = 1024  # a page burst (500 pages reconnecting to a restarted node) must not be refused
# A child that dies this soon after starting, this many times in a row, is not started again: the
# application itself is broken (a bad setting, a missing migration) and the node exits with an error.
QUICK_DEATH_S = 10.0
QUICK_DEATHS_MAX = 5
STOP_TIMEOUT_S = 10.0


def default_processes() -> int:
    """INFLIGHT_WEB_PROCESSES, else the CPU count up to DEFAULT_MAX_PROCESSES."""
    configured = os.environ.get("INFLIGHT_WEB_PROCESSES", "").strip()
    if configured:
        try:
            return int(configured)
        except ValueError:
            raise SystemExit(f"inflight.web.node: INFLIGHT_WEB_PROCESSES must be a whole number, not {configured!r}") from None
    return max(1, min(os.cpu_count() or 1, DEFAULT_MAX_PROCESSES))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inflight.web.node", description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--bind", default="127.0.0.1", help="Address to listen on (0.0.0.0: every interface).")
    parser.add_argument("-p", "--port", type=int, default=8000, help="TCP port to listen on.")
    parser.add_argument("--processes", type=int, default=default_processes(),
                        help=f"Daphne processes serving the port (default: INFLIGHT_WEB_PROCESSES, else the CPU count up to {DEFAULT_MAX_PROCESSES}).")
    parser.add_argument("daphne_args", nargs=argparse.REMAINDER, metavar="-- DAPHNE_OPTION ...",
                        help="Options for every Daphne process, after `--` (e.g. -- --proxy-headers).")
    args = parser.parse_args(argv)
    if args.daphne_args[:1] == ["--"]:
        args.daphne_args = args.daphne_args[1:]
    elif args.daphne_args:
        parser.error(f"unknown options {' '.join(args.daphne_args)} (Daphne's go after --)")
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    return args


def _bound(sock: socket.socket, bind: str, port: int) -> socket.socket:
    """`sock` bound to bind:port (SO_REUSEADDR), or the node exits with a clear error (closing it)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"inflight.web.node: cannot listen on {bind}:{port}: {exc.strerror or exc}") from None
    return sock


def claim_port(bind: str, port: int) -> int:
    """The port, once a socket without SO_REUSEPORT could bind it: SO_REUSEPORT alone would let a
    second node (a second `make demo`) share a port that another one of this user listens on, and
    the connections be spread over two unrelated nodes. Port 0: a free one."""
    with _bound(socket.socket(socket.AF_INET, socket.SOCK_STREAM), bind, port) as probe:
        return int(probe.getsockname()[1])


def listening_socket(bind: str, port: int) -> socket.socket:
    """One process's listening socket on the node's port (SO_REUSEPORT: the kernel spreads new
    connections evenly over the node's sockets), inheritable by it. A clear error when taken."""
    # IPv4 only: Daphne adopts an inherited socket as AF_INET (its `--fd` takes no address family).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    _bound(sock, bind, port).listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


@dataclass
class Child:
    index: int
    sock: socket.socket  # its own listening socket; closed when it dies, so no connection waits on it
    process: subprocess.Popen[bytes]
    started_at: float
    quick_deaths: int = 0


@dataclass
class WebNode:
    """One socket and one Daphne process per `processes`, all on `bind`:`port`. A single socket
    shared by every process spread the connections by who woke first: 171 and 29 of 200 (one
    process then does most of the pages' pushes); one socket each (SO_REUSEPORT) spreads them evenly."""

    bind: str
    port: int
    processes: int
    daphne_args: list[str] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)

    def start_child(self, index: int, quick_deaths: int = 0) -> Child:
        sock = listening_socket(self.bind, self.port)
        env = {**os.environ, "INFLIGHT_WEB_PROCESSES": str(self.processes)}  # the settings split the node's database pool by it
        if index > 0:
            env["INFLIGHT_WEB_SWEEPER"] = "0"
        # Ctrl-C reaches the whole terminal group: the children ignore it and this process stops them.
        command = die_with_parent([sys.executable, "-m", "daphne", "--fd", str(sock.fileno()), *self.daphne_args, APPLICATION], ignore_sigint=True)
        process = subprocess.Popen(command, env=env, pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL)
        logger.info("web node: process %d started (pid %d)", index, process.pid)
        return Child(index, sock, process, time.monotonic(), quick_deaths)

    def start(self) -> None:
        self.port = claim_port(self.bind, self.port)
        self.children = [self.start_child(index) for index in range(self.processes)]

    def watch_once(self) -> int | None:
        """Start again every child that died; the node's exit code once it must stop, else None."""
        for position, child in enumerate(self.children):
            code = child.process.poll()
            if code is None:
                continue
            child.sock.close()  # new connections go to the other processes' sockets meanwhile
            quick = time.monotonic() - child.started_at < QUICK_DEATH_S
            deaths = child.quick_deaths + 1 if quick else 0
            if deaths >= QUICK_DEATHS_MAX:
                logger.error("web node: process %d exited %d times within %.0f s of starting (last code %s); stopping the node",
                             child.index, deaths, QUICK_DEATH_S, code)
                return 1
            logger.warning("web node: process %d (pid %d) exited with code %s; starting it again", child.index, child.process.pid, code)
            if quick:
                time.sleep(min(5.0, 0.5 * 2 ** deaths))  # a crash loop must not spin
            self.children[position] = self.start_child(child.index, deaths)
        return None

    def stop(self) -> None:
        for child in self.children:
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait(5)
            child.sock.close()


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = parse_args(argv)
    node = WebNode(args.bind, args.port, args.processes, args.daphne_args)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    code = 0
    try:
        node.start()
        logger.info("web node: %d Daphne processes on %s:%d", args.processes, args.bind, node.port)
        while (exit_code := node.watch_once()) is None:
            time.sleep(0.5)
        code = exit_code
    except _Stop:
        pass
    finally:
        node.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
