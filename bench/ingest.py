"""Metric ingest: points/s into PostgreSQL, and arrival → WebSocket latency.

Starts a private embedded PostgreSQL + Redis (the demo's settings: fsync on), migrates, then
measures side by side in this one run:

  throughput  `inflight.runs.services.ingest_metrics` (seq bump, then one statement that
              INSERTs the batch — SELECT unnest(binary arrays) ON CONFLICT DO NOTHING — and folds
              the stored points into the run's snapshot buckets, commit, Channels push queued in
              order) for several batch sizes, timed until every push was handed to Redis too;
              against the naive ORM path (`bulk_create(ignore_conflicts=True)` + seq update, which
              neither folds nor pushes) on the same data; and the same batch re-sent (the
              idempotent path: every point a duplicate).
  latency     a client on the UI's live consumer (`inflight.live.consumers.RunConsumer`, through
              Channels' WebsocketCommunicator on the real Redis channel layer) while batches
              arrive every 250 ms (the worker's tail interval): time from the ingest call of a
              point's batch to the client receiving that point (the consumer paces pushes to
              4 a second with a burst of 1.5, `inflight.live.consumers.PushPacer`); measured
              also with a fixed 250 ms window (burst 1.0: the pacing before), side by side.

Goals: ingest_points_per_s >= 20,000 (at 2,000-point batches, ~100 metrics lines of 20
metrics: what one 250 ms tail of a busy run holds), ws_latency_p95_ms <= 200.

    .venv/bin/python bench/ingest.py [--points 200000] [--latency-batches 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
METRICS_PER_LINE = 20


def make_points(first_line: int, lines: int):
    from inflight.runs.services import PointIn

    now = time.time()
    return [
        PointIn(line=line, name=f"metric/{m:02d}", step=line, t=now, value=float(line * 0.001 + m))
        for line in range(first_line, first_line + lines)
        for m in range(METRICS_PER_LINE)
    ]


def ingest_orm(run_id: int, points) -> None:
    """The baseline: Django's bulk_create with ON CONFLICT DO NOTHING, then the seq bump."""
    from django.db import transaction
    from django.db.models import F

    from inflight.runs.models import MetricPoint, Run

    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(metrics_seq=F("metrics_seq") + 1)
        seq = Run.objects.filter(pk=run_id).values_list("metrics_seq", flat=True).get()
        MetricPoint.objects.bulk_create(
            [MetricPoint(run_id=run_id, line=p.line, name=p.name, step=p.step, t=p.t, value=p.value, seq=seq) for p in points],
            ignore_conflicts=True,
        )


def throughput(owner, total_points: int, batch_points: int, mode: str) -> float:
    from inflight.runs import services

    run = services.create_run(owner, f"bench-{mode}-{batch_points}", {})
    lines_per_batch = max(1, batch_points // METRICS_PER_LINE)
    batches = [make_points(i * lines_per_batch, lines_per_batch) for i in range(max(1, total_points // batch_points))]
    if mode == "duplicate":
        for batch in batches:
            services.ingest_metrics(run.pk, batch)
    services.flush_broadcasts(30.0)
    start = time.perf_counter()
    for batch in batches:
        if mode == "orm":
            ingest_orm(run.pk, batch)
        else:
            services.ingest_metrics(run.pk, batch)
    services.flush_broadcasts(30.0)  # the pushes are part of the path: count until they left
    elapsed = time.perf_counter() - start
    return sum(len(b) for b in batches) / elapsed


async def latency(owner, run, batches: int, lines_per_batch: int, interval_s: float) -> tuple[list[float], list[float]]:
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator

    from inflight.live.routing import websocket_urlpatterns
    from inflight.runs import services

    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/runs/{run.pk}/")
    communicator.scope["user"] = owner
    connected, _ = await communicator.connect()
    assert connected, "the live consumer refused the connection"
    hello = await communicator.receive_json_from(timeout=10)
    assert hello.get("type") == "hello", hello
    sent_at: dict[int, float] = {}

    def produce() -> None:
        from django.db import connection

        for index in range(batches):
            batch = make_points(index * lines_per_batch, lines_per_batch)
            sent_at[index] = time.time()
            services.ingest_metrics(run.pk, batch)
            time.sleep(interval_s)
        connection.close()

    producer = threading.Thread(target=produce)
    producer.start()
    latencies: list[float] = []
    push_times: list[float] = []
    expected = batches * lines_per_batch * METRICS_PER_LINE
    received = 0
    while received < expected:
        message = await communicator.receive_json_from(timeout=30)
        arrived = time.time()
        if message.get("type") != "metrics.batch":
            continue
        push_times.append(arrived)
        for name, step, t, value in message["points"]:
            latencies.append((arrived - sent_at[int(step) // lines_per_batch]) * 1000)
            received += 1
    producer.join()
    await communicator.disconnect()
    return latencies, push_times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000, help="Points per throughput measurement.")
    parser.add_argument("--latency-batches", type=int, default=60, help="Batches sent to the WebSocket client.")
    args = parser.parse_args()

    from inflight.devservices import free_port, start_services, stop_services

    folder = REPO_ROOT / "var" / "bench-ingest" / str(os.getpid())
    services_info = start_services(folder, postgres_port=free_port(), redis_port=free_port())
    try:
        os.environ.update(services_info.env())
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        owner = get_user_model().objects.create_user(f"bench-{os.getpid()}")

        # Latency first: after the throughput rows the table holds millions of points and
        # autovacuum works through them, which would measure the bench's own backlog.
        from inflight.runs import services

        latency_run = services.create_run(owner, "bench-latency", {})
        # Side by side: the consumer's pacing as shipped (burst 1.5) and a fixed 250 ms window
        # (burst 1.0: push only when the last push is >= 250 ms old, else at the window's end).
        from inflight.live import consumers

        shipped_burst = consumers.PUSH_BURST
        consumers.PUSH_BURST = 1.0
        window_run = services.create_run(owner, "bench-latency-window", {})
        window_latencies, _ = asyncio.run(latency(owner, window_run, args.latency_batches, lines_per_batch=25, interval_s=0.25))
        window_latencies.sort()
        consumers.PUSH_BURST = shipped_burst
        latencies, push_times = asyncio.run(latency(owner, latency_run, args.latency_batches, lines_per_batch=25, interval_s=0.25))
        latencies.sort()
        most_pushes_in_1s = max(sum(1 for t in push_times if start <= t < start + 1.0) for start in push_times)

        rows = []
        for batch_points in (200, 2_000, 20_000):
            for mode in ("services", "orm", "duplicate"):
                if mode == "orm" and batch_points == 200:
                    continue
                rate = throughput(owner, args.points, batch_points, mode)
                rows.append((batch_points, mode, rate))
        print(f"{'batch points':>12} {'path':>10} {'points/s':>12}")
        for batch_points, mode, rate in rows:
            print(f"{batch_points:>12} {mode:>10} {rate:>12,.0f}")
        by_key = {(b, m): r for b, m, r in rows}
        print(f"services / orm at 2,000-point batches: {by_key[(2000, 'services')] / by_key[(2000, 'orm')]:.2f}x")

        p50 = statistics.median(latencies)
        p95 = latencies[int(0.95 * (len(latencies) - 1))]
        window_p95 = window_latencies[int(0.95 * (len(window_latencies) - 1))]
        print(f"ws latency with a fixed 250 ms window: p50 {statistics.median(window_latencies):.1f} ms, p95 {window_p95:.1f} ms, max {window_latencies[-1]:.1f} ms")
        print(f"ws latency over {len(latencies)} points in {args.latency_batches} batches: p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {latencies[-1]:.1f} ms")
        print(f"pushes: {len(push_times)} over {push_times[-1] - push_times[0]:.1f} s, most in any 1 s window: {most_pushes_in_1s}")
        print(f"RESULT ingest_points_per_s {by_key[(2000, 'services')]:.0f}")
        print(f"RESULT ingest_speedup_vs_orm {by_key[(2000, 'services')] / by_key[(2000, 'orm')]:.2f}")
        print(f"RESULT ws_latency_p95_ms {p95:.1f}")
        print(f"RESULT ws_latency_p95_fixed_window_ms {window_p95:.1f}")
    finally:
        from django.db import connections

        connections.close_all()
        stop_services(folder)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
