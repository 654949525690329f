"""The launcher's watchdog on real processes (rl_core/launch/watchdog.py): a server that stops answering
/health and a role that stops beating (SIGSTOP: alive, port open, answering nothing) are reported
after a few seconds and named once silent for the hang limit; an answering one never is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from rl_core.common.processes import free_port
from rl_core.launch.watchdog import SILENT_METRIC, SILENT_REPORT_S, RoleHung, Watchdog

REPO_ROOT = Path(__file__).resolve().parents[2]
HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status": "ok"}')
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""
BEATING_ROLE = "import sys, time; from rl_core.rundir.heartbeats import start_heartbeat; start_heartbeat(sys.argv[1], sys.argv[2], every_s=0.2); time.sleep(600)"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_stopped_server_and_a_stopped_role_are_reported_then_named(tmp_path: Path, processes: list[subprocess.Popen]) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    processes.append(subprocess.Popen([sys.executable, "-c", HEALTH_SERVER, str(port)]))
    processes.append(subprocess.Popen([sys.executable, "-c", BEATING_ROLE, str(tmp_path), "actor"], env=env))
    server, actor = processes
    watchdog = Watchdog(tmp_path, hang_limit_s=SILENT_REPORT_S + 4)
    try:
        wait_until(lambda: (tmp_path / "heartbeats" / "actor").exists(), 30, "the actor's first beat")
        watchdog.watch_server("server0", f"http://127.0.0.1:{port}")
        watchdog.watch_heartbeat("actor")
        # Both answer: nothing reported however long it runs.
        time.sleep(SILENT_REPORT_S + 5)
        now = time.monotonic()
        watchdog.check(now)
        assert set(watchdog.metrics(now)) == {SILENT_METRIC} and watchdog.metrics(now)[SILENT_METRIC] < SILENT_REPORT_S

        server.send_signal(signal.SIGSTOP)  # its port stays open; it answers nothing
        wait_until(lambda: f"{SILENT_METRIC}/server0" in watchdog.metrics(time.monotonic()), SILENT_REPORT_S + 10, "server0 reported silent")
        assert f"{SILENT_METRIC}/actor" not in watchdog.metrics(time.monotonic())
        with pytest.raises(RoleHung) as hung:
            wait_until(lambda: watchdog.check(time.monotonic()) and False, 30, "the hang limit")
        assert hung.value.role == "server0" and "server0 stopped answering" in str(hung.value) and "/health" in str(hung.value)
        # An exited or finished role is not the watchdog's: only the running ones are judged.
        watchdog.check(time.monotonic(), running={"actor"})

        actor.send_signal(signal.SIGSTOP)
        with pytest.raises(RoleHung) as hung:
            wait_until(lambda: watchdog.check(time.monotonic(), running={"actor"}) and False, 30, "the actor's hang")
        assert hung.value.role == "actor" and "wrote no heartbeat" in str(hung.value)
    finally:
        watchdog.close()


def test_a_runs_actor_has_no_request_deadline_of_its_own_but_a_connect_one() -> None:
    """A long generation of a large model is not a hang: the actor's requests wait as long as the
    server answers its /health (the watchdog's deadline), while reaching a server stays bounded."""
    import asyncio

    from rl_core.actor.main import actor_clients
    from rl_core.inference.client import CONNECT_DEADLINE_S

    clients = actor_clients(["http://127.0.0.1:9"])
    try:
        timeout = clients[0]._http.timeout
        assert timeout.read is None and timeout.write is None and timeout.connect == CONNECT_DEADLINE_S
    finally:
        asyncio.run(clients[0].aclose())
