"""Two web nodes behind one PostgreSQL and one Redis channel layer (issue 24, at a CI size; the
figures are bench/platform_scale.py's): run pages on either Daphne get every push of a run ingested
elsewhere (here: the test process, through the real ingest service and broadcaster), and when one
node is killed its pages reconnect to the other and still end with exactly the run's series — not
one push lost, duplicated or out of order. Also: an idle run page keeps its socket (the channel
layer's Redis reads outlast channels_redis's 5 s blocking read).

Real: two Daphne processes serving inflight.asgi, PostgreSQL, Redis, the ingest service; the pages
are Python WebSocket clients doing what run_page.js does (run_page_client.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from downsample_oracle import snapshot_from_points
from inflight.devservices import free_port
from inflight.live import ingest as live_ingest
from inflight.live import broadcast
from run_page_client import ClientRecord, run_page_client

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

pytest.importorskip("websockets")


def _start_daphne(database_url: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "inflight.settings", "OMP_NUM_THREADS": "1",
           "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "inflight.asgi:application"],
                                   cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture
def web_nodes(live_database_url: str, transactional_db: None, tmp_path: Path, wait: Callable[..., Any]) -> Iterator[list[tuple[subprocess.Popen, str]]]:
    nodes = [_start_daphne(live_database_url, tmp_path / f"daphne-{n}.log") for n in range(2)]
    try:
        for n, (process, base) in enumerate(nodes):
            def listening() -> bool:
                if process.poll() is not None and process.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"daphne {n} exited:\n{(tmp_path / f'daphne-{n}.log').read_text()[-3000:]}")
                with socket.socket() as sock:
                    return sock.connect_ex(("127.0.0.1", int(base.rsplit(":", 1)[1]))) == 0

            wait(listening, timeout=60, message=f"daphne {n} to listen")
        yield nodes
    finally:
        for process, _ in nodes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)


class Pages:
    """Run-page clients on their own event loop thread; `records` fill in as they run."""

    def __init__(self, cookie: str, clients: list[tuple[int, list[str]]]) -> None:
        self.records = [ClientRecord(n, run_id) for n, (run_id, _) in enumerate(clients)]
        self.clients = clients
        self.cookie = cookie
        self.loop = asyncio.new_event_loop()
        self.stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.ready = threading.Event()

    async def _main(self) -> None:
        import httpx

        self.stop = asyncio.Event()
        bases = sorted({base for _, node_bases in self.clients for base in node_bases})
        http = {base: httpx.AsyncClient(cookies={"sessionid": self.cookie}, timeout=60) for base in bases}
        tasks = [asyncio.ensure_future(run_page_client(record, node_bases, self.cookie, self.stop, http))
                 for record, (_, node_bases) in zip(self.records, self.clients)]
        self.ready.set()
        await asyncio.gather(*tasks)
        for client in http.values():
            await client.aclose()

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(30)

    def finish(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(60)


def _session_cookie(user: Any) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _running_runs(owner: Any, count: int, tiny_config: dict) -> list[Any]:
    from inflight.runs import services
    from inflight.runs.models import Run, RunStatus

    runs = [services.create_run(owner, f"live-{n}", tiny_config) for n in range(count)]
    Run.objects.filter(pk__in=[run.pk for run in runs]).update(status=RunStatus.RUNNING)
    return runs


def test_pages_on_two_web_nodes_get_every_push_and_a_killed_nodes_pages_end_complete(
    web_nodes: list[tuple[subprocess.Popen, str]], owner: Any, tiny_config: dict, wait: Callable[..., Any]
) -> None:
    from inflight.runs import services
    from inflight.runs.models import Run

    (_, node_a), (node_b_process, node_b) = web_nodes
    runs = _running_runs(owner, 3, tiny_config)
    # Two pages per run: one on each node, each falling back on the other node.
    clients = [(run.pk, [node_a, node_b] if n % 2 == 0 else [node_b, node_a]) for run in runs for n in range(2)]
    pages = Pages(_session_cookie(owner), clients)
    pages.start()
    wait(lambda: all(record.connects and record.refetches for record in pages.records), timeout=60, message="every page to open and load its snapshot")
    written: dict[int, list[tuple[str, int, float, float]]] = {run.pk: [] for run in runs}
    batches = 24
    for batch in range(batches):
        if batch == batches // 2:
            os.killpg(node_b_process.pid, signal.SIGKILL)  # node B dies mid-run, no goodbye to its sockets
        for run in runs:
            points = [live_ingest.PointIn(line=2 * batch + k, name=f"m/{m}", step=2 * batch + k, t=time.time(), value=float(run.pk * 1000 + 2 * batch + k + m))
                      for k in range(2) for m in range(3)]
            live_ingest.ingest_metrics(run.pk, points)
            written[run.pk] += [(p.name, p.step, p.t, p.value) for p in points]
        time.sleep(0.15)
    broadcast.flush_broadcasts()
    final_seq = {run.pk: Run.objects.get(pk=run.pk).metrics_seq for run in runs}
    wait(lambda: all(record.seq == final_seq[record.run_id] for record in pages.records), timeout=60,
         message="every page to hold every batch of its run")
    pages.finish()
    killed = [record for record, (_, node_bases) in zip(pages.records, clients) if node_bases[0] == node_b]
    assert killed and all(record.connects >= 2 for record in killed), [(r.client, r.connects, r.errors) for r in killed]
    keys = ("shift", "max_step", "series")
    for record in pages.records:
        expected = snapshot_from_points(written[record.run_id])
        assert record.final is not None and {k: record.final[k] for k in keys} == {k: expected[k] for k in keys}, f"page {record.client} of run {record.run_id}"
        assert record.gaps == 0 and record.duplicates_or_out_of_order == 0, (record.client, record.gaps, record.duplicates_or_out_of_order)
        assert record.latencies_ms, f"page {record.client} got no live push"


def test_an_idle_run_page_keeps_its_socket(web_nodes: list[tuple[subprocess.Popen, str]], owner: Any, tiny_config: dict, wait: Callable[..., Any]) -> None:
    """channels_redis reads a consumer's messages with a 5 s blocking BZPOPMIN; with redis-py's
    default 5 s socket timeout an idle page's consumer crashed on it (1011) and the page had to
    reconnect every few seconds. Idle for 12 s, it must keep its one connection and still get a push."""
    from inflight.runs import services

    (_, node_a), _ = web_nodes
    [run] = _running_runs(owner, 1, tiny_config)
    pages = Pages(_session_cookie(owner), [(run.pk, [node_a])])
    pages.start()
    wait(lambda: pages.records[0].refetches, timeout=60, message="the page to load its snapshot")
    time.sleep(12)
    live_ingest.ingest_metrics(run.pk, [live_ingest.PointIn(line=0, name="m", step=0, t=time.time(), value=1.0)])
    broadcast.flush_broadcasts()
    wait(lambda: pages.records[0].seq == 1, timeout=30, message="the push after the idle spell")
    pages.finish()
    record = pages.records[0]
    assert record.connects == 1 and not record.errors, (record.connects, record.errors)
