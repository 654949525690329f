"""The database goes away mid-run: the worker keeps the file offsets and delivers every point later.

The outage is real: the worker reaches PostgreSQL through a TCP relay on 127.0.0.1 that this
test cuts (existing connections dropped, new ones refused) and then restores.
"""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from inflight.devservices import free_port
from inflight.runs import services
from inflight.runs.models import MetricPoint, Run, RunStatus


class TcpRelay:
    """Forwards 127.0.0.1:<port> to a target port until cut."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.cut = threading.Event()
        self.stopped = threading.Event()
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.listener.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            if self.cut.is_set():
                client.close()  # the database is "down": refuse
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.connections += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while not self.cut.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def cut_off(self) -> None:
        self.cut.set()
        with self.lock:
            for sock in self.connections:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.connections.clear()

    def restore(self) -> None:
        self.cut.clear()

    def close(self) -> None:
        self.stopped.set()
        self.cut_off()
        self.listener.close()


@pytest.fixture
def relay(embedded_services):
    relay = TcpRelay(embedded_services.postgres_port)
    yield relay
    relay.close()


def test_points_written_while_the_database_is_away_arrive_later(start_worker, engine_command, live_database_url, relay, owner, wait) -> None:
    relayed_url = live_database_url.replace(f":{relay.target_port}/", f":{relay.port}/")
    assert relayed_url != live_database_url
    worker = start_worker(extra_env={"INFLIGHT_RL_COMMAND": engine_command, "DATABASE_URL": relayed_url})
    steps = 40
    run = services.create_run(owner, "slow", {"name": "slow", "trainer": {"max_steps": steps}})
    wait(lambda: MetricPoint.objects.filter(run=run).exists(), timeout=90, message="first points")
    relay.cut_off()
    during = MetricPoint.objects.filter(run=run).count()
    time.sleep(3.0)  # the engine keeps writing ~20 lines meanwhile
    assert MetricPoint.objects.filter(run=run).count() == during  # nothing can reach the database
    relay.restore()
    done = wait(lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r, timeout=120, message="run to end")
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert MetricPoint.objects.filter(run=run).count() == steps * 2  # every point, none twice
    assert "metrics delivery failed" in worker.log()  # the outage really hit the worker
    assert sorted(MetricPoint.objects.filter(run=run, name="train/loss").values_list("step", flat=True)) == list(range(steps))
