"""A web node (inflight/web/node.py): several Daphne processes serve one port; one that dies is
started again while the others go on serving; a node whose application cannot start stops with an
error instead of restarting it for ever; a taken port is a clear error."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from inflight.devservices import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def start_node(port: int, log_path: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "inflight.settings", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                   "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}", **env}
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "inflight.web.node", "-b", "127.0.0.1", "-p", str(port), *args],
                                cwd=REPO_ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def daphnes(node: subprocess.Popen[bytes]) -> set[int]:
    return {child.pid for child in psutil.Process(node.pid).children() if "daphne" in " ".join(child.cmdline())}


def login_page_status(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=10) as answer:
        return answer.status


@pytest.fixture
def node_of_two(live_database_url: str, transactional_db: None, tmp_path: Path, wait: Callable[..., Any]) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port, log_path = free_port(), tmp_path / "node.log"
    node = start_node(port, log_path, "--processes", "2", DATABASE_URL=live_database_url)
    try:
        wait(lambda: log_path.read_text().count("Listening on TCP address") == 2, timeout=90, message="both processes to listen")
        yield node, port, log_path
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(10)


def test_every_process_of_a_node_serves_its_port_and_one_that_dies_is_started_again(
    node_of_two: tuple[subprocess.Popen[bytes], int, Path], wait: Callable[..., Any]
) -> None:
    node, port, log_path = node_of_two
    first, second = sorted(daphnes(node))
    assert all(psutil.Process(pid).environ()["INFLIGHT_WEB_PROCESSES"] == "2" for pid in (first, second))  # they split the pool

    os.kill(first, signal.SIGKILL)
    wait(lambda: "exited with code" in log_path.read_text(), timeout=10, message="the node to see it die")
    # Its socket is closed: the other process answers every request meanwhile, pages and WebSockets alike.
    assert [login_page_status(port) for _ in range(10)] == [200] * 10
    with connect(f"ws://127.0.0.1:{port}/ws/runs/1/", origin=f"http://127.0.0.1:{port}") as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401  # not signed in: the consumer's answer

    replacement = wait(lambda: (daphnes(node) - {second}) - {first}, timeout=60, message="the dead process to be started again")
    assert len(replacement) == 1 and first not in daphnes(node)
    wait(lambda: log_path.read_text().count("Listening on TCP address") == 3, timeout=90, message="the new process to listen")

    # Now the one started again serves the port alone.
    os.kill(second, signal.SIGKILL)
    wait(lambda: log_path.read_text().count("exited with code") == 2, timeout=10, message="the node to see it die")
    assert [login_page_status(port) for _ in range(10)] == [200] * 10

    node.send_signal(signal.SIGTERM)
    assert node.wait(30) == 0
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in replacement)


def test_a_node_whose_application_cannot_start_stops_with_an_error(live_database_url: str, tmp_path: Path) -> None:
    port, log_path = free_port(), tmp_path / "node.log"
    # The settings refuse to serve without a SECRET_KEY when DEBUG is off: every start fails.
    node = start_node(port, log_path, "--processes", "1", DATABASE_URL=live_database_url, SECRET_KEY="", DEBUG="0")
    try:
        assert node.wait(120) == 1
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
    log = log_path.read_text()
    assert "SECRET_KEY must be set" in log and "stopping the node" in log
    assert log.count("started (pid") == 5  # five quick deaths in a row, then it gives up


def test_a_nodes_connections_are_spread_evenly_over_its_processes(node_of_two: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    node, port, _ = node_of_two
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        time.sleep(1.0)
        per_process = sorted(sum(1 for c in psutil.Process(pid).net_connections() if c.status == "ESTABLISHED") for pid in daphnes(node))
        # One socket shared by both gave 29 and 171 (the first to wake took most); by hash ~100 each.
        assert len(per_process) == 2 and sum(per_process) == 200 and per_process[0] >= 60, per_process
    finally:
        for sock in held:
            sock.close()


def test_a_taken_port_or_a_typo_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = time.monotonic()
        node = start_node(port, tmp_path / "node.log")
        assert node.wait(30) == 1 and time.monotonic() - started < 30
    assert f"cannot listen on 127.0.0.1:{port}" in (tmp_path / "node.log").read_text()

    # Nor may a second node share a port the first listens on (its sockets allow reuse among themselves).
    with socket.socket() as first_node:
        first_node.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        first_node.bind(("127.0.0.1", 0))
        first_node.listen(1)
        port = first_node.getsockname()[1]
        second = start_node(port, tmp_path / "second.log")
        assert second.wait(30) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in (tmp_path / "second.log").read_text()

    typo = subprocess.run([sys.executable, "-m", "inflight.web.node", "--proccesses", "2"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert typo.returncode == 2 and "unrecognized arguments: --proccesses" in typo.stderr
    bad_count = subprocess.run([sys.executable, "-m", "inflight.web.node"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                               env={**os.environ, "INFLIGHT_WEB_PROCESSES": "two"})
    assert bad_count.returncode == 1 and "INFLIGHT_WEB_PROCESSES must be a whole number, not 'two'" in bad_count.stderr
