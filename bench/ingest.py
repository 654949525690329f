"""Metric ingest: points/s into PostgreSQL, and arrival → WebSocket latency.

Starts a private embedded PostgreSQL + Redis (the demo's settings: fsync on), migrates, then
measures side by side in this one run:

  throughput  `inflight.live.ingest.ingest_metrics` (seq bump, then one statement that
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

Every measurement has a run of its own, which lives as a worker runs it (`benchlib.live_run`:
submitted through `services.create_run` with its per-user limit, claimed, running, succeeded) and
has ended before the next is submitted: one user's runs one after the other, as a lab's come and go.

    .venv/bin/python bench/ingest.py [--points 200000] [--latency-batches 60] [--smoke]

`--smoke`: 2,000 points per throughput row, 4 latency batches, and no 20,000-point batch rows
(one such batch alone is 10x the smoke's points; the RESULT lines are the 2,000-point ones).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

from benchlib import METRICS_PER_LINE, live_run, make_points, parse_bench_args, platform_services, ws_latency  # first: it puts the checkout on sys.path


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

    with live_run(owner, f"bench-{mode}-{batch_points}") as run:
        return _throughput(run, total_points, batch_points, mode)


def _throughput(run, total_points: int, batch_points: int, mode: str) -> float:
    from inflight.live.broadcast import flush_broadcasts
    from inflight.live.ingest import ingest_metrics

    lines_per_batch = max(1, batch_points // METRICS_PER_LINE)
    batches = [make_points(i * lines_per_batch, lines_per_batch) for i in range(max(1, total_points // batch_points))]
    if mode == "duplicate":
        for batch in batches:
            ingest_metrics(run.pk, batch)
    flush_broadcasts(30.0)
    start = time.perf_counter()
    for batch in batches:
        if mode == "orm":
            ingest_orm(run.pk, batch)
        else:
            ingest_metrics(run.pk, batch)
    flush_broadcasts(30.0)  # the pushes are part of the path: count until they left
    elapsed = time.perf_counter() - start
    return sum(len(b) for b in batches) / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000, help="Points per throughput measurement.")
    parser.add_argument("--latency-batches", type=int, default=60, help="Batches sent to the WebSocket client.")
    args = parse_bench_args(parser, smoke={"points": 2_000, "latency_batches": 4})

    with platform_services("ingest"):
        from django.contrib.auth import get_user_model

        owner = get_user_model().objects.create_user(f"bench-{os.getpid()}")

        # Latency first: after the throughput rows the table holds millions of points and
        # autovacuum works through them, which would measure the bench's own backlog.
        # Side by side: the consumer's pacing as shipped (burst 1.5) and a fixed 250 ms window
        # (burst 1.0: push only when the last push is >= 250 ms old, else at the window's end).
        from inflight.live import consumers

        shipped_burst = consumers.PUSH_BURST
        consumers.PUSH_BURST = 1.0
        with live_run(owner, "bench-latency-window") as window_run:
            window_latencies, _ = asyncio.run(ws_latency(owner, window_run, args.latency_batches, lines_per_batch=25, interval_s=0.25))
        window_latencies.sort()
        consumers.PUSH_BURST = shipped_burst
        with live_run(owner, "bench-latency") as latency_run:
            latencies, push_times = asyncio.run(ws_latency(owner, latency_run, args.latency_batches, lines_per_batch=25, interval_s=0.25))
        latencies.sort()
        most_pushes_in_1s = max(sum(1 for t in push_times if start <= t < start + 1.0) for start in push_times)

        rows = []
        # --smoke: the 20,000-point size would still ingest a whole 20,000-point batch per path
        # (10x --points) for table rows only; the RESULT lines are the 2,000-point ones.
        for batch_points in (200, 2_000) if args.smoke else (200, 2_000, 20_000):
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
