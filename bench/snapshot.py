"""How fast the run page's downsampled snapshot is served for a 1,000,000-point run.

Starts a private embedded PostgreSQL (fsync off: a throwaway database) and Redis, migrates, and
stores 1M metric points of one run (20 metrics x 50,000 steps) through the real ingest
path (`inflight.live.ingest.ingest_metrics`, batches of 1,000 metrics.jsonl lines =
20,000 points, each folded into the run's snapshot buckets as it is stored). Then times,
side by side in this one run:

  cold       the first snapshot of the run after its ingest (nothing read it before)
  warm       inflight.live.selectors.run_snapshot_json again
  live       the same right after a new 20k-point ingest batch
  endpoint   GET /runs/<id>/snapshot.json through Django (auth, query, JSON)
  catch-up   a second 1M-point run COPYed straight into the table (as ingest stored points
             before it folded them): its first snapshot folds all 1M points at once
  naive      every point to Python (inflight.runs.selectors.metric_points_page, unbounded) and
             downsampled there with the reference algorithm — what the SQL replaces

Prints a table and `RESULT` lines; goal: snapshot_1m_ms <= 300 (now the cold figure: the worst
of cold and warm).

    .venv/bin/python bench/snapshot.py [--points 1000000] [--repeats 7] [--smoke]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

from benchlib import parse_bench_args, platform_services  # first: it puts the checkout on sys.path


def _timed(fn, repeats: int) -> tuple[float, list[float], object]:
    times = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), times, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="Metric points to insert (20 metrics per step).")
    parser.add_argument("--repeats", type=int, default=7, help="Timed repetitions (median reported).")
    parser.add_argument("--naive-repeats", type=int, default=2, help="Repetitions of the slow all-points baseline.")
    args = parse_bench_args(parser, smoke={"points": 40_000, "repeats": 1, "naive_repeats": 1})

    # Redis too: ingest pushes every batch to the run's channel group, as in production.
    with platform_services("snapshot", fast_unsafe=True):
        return run_bench(args)


def run_bench(args: argparse.Namespace) -> int:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from tests.platform.downsample_oracle import snapshot_from_points  # the reference algorithm (tests side)
    from inflight.live.selectors import run_snapshot, run_snapshot_json
    from inflight.runs.models import MetricPoint, Run
    from inflight.runs.selectors import metric_points_page
    from inflight.live.broadcast import flush_broadcasts
    from inflight.live.ingest import PointIn, ingest_metrics

    # No password: the client logs in with force_login, and hashing one (PBKDF2) is ~0.4 CPU-s.
    user = get_user_model().objects.create_user("bench")
    names = [f"metric/{i:02d}" for i in range(20)]
    steps = args.points // len(names)

    def value_at(step: int, index: int) -> float:
        return ((step * 7919 + index * 104729) % 1000) / 1000.0

    # The run as the platform stores it: through ingest, 1,000 lines per batch.
    run = Run.objects.create(owner=user, name="bench-1m", config={"trainer": {"samples_per_step": 32}}, status="running")
    load_start = time.perf_counter()
    for first in range(0, steps, 1_000):
        ingest_metrics(run.pk, [
            PointIn(line=step, name=name, step=step, t=1_700_000_000.0 + step * 0.8, value=value_at(step, index))
            for step in range(first, min(steps, first + 1_000))
            for index, name in enumerate(names)
        ])
    ingest_s = time.perf_counter() - load_start
    flush_broadcasts()
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {MetricPoint._meta.db_table}")
    total = MetricPoint.objects.filter(run=run).count()

    # Cold: the first snapshot of the run after its ingest.
    cold_start = time.perf_counter()
    run_snapshot_json(run)
    cold_ms = (time.perf_counter() - cold_start) * 1000
    # Warm: what every later page load of the finished run costs.
    selector_ms, selector_all, _ = _timed(lambda: run_snapshot_json(run), args.repeats)
    snapshot = run_snapshot(run)
    client = Client()
    client.force_login(user)
    url = f"/runs/{run.pk}/snapshot.json"

    def fetch() -> int:
        response = client.get(url)
        assert response.status_code == 200, response.status_code
        return len(response.content)

    endpoint_ms, endpoint_all, body_bytes = _timed(fetch, args.repeats)

    # Catch-up: the same points COPYed into a second run without folding (how ingest stored
    # them before it folded its batches); its first snapshot folds them all at once.
    legacy = Run.objects.create(owner=user, name="bench-1m-legacy", config={}, status="running")
    buffer = io.StringIO()
    for step in range(steps):
        seq = step // 1_000 + 1
        t = 1_700_000_000.0 + step * 0.8
        for index, name in enumerate(names):
            buffer.write(f"{legacy.pk}\t{name}\t{step}\t{t!r}\t{value_at(step, index)!r}\t{step}\t{seq}\n")
    buffer.seek(0)
    with connection.cursor() as cursor:
        with cursor.copy(f"COPY {MetricPoint._meta.db_table} (run_id, name, step, t, value, line, seq) FROM STDIN") as copy:
            while chunk := buffer.read(1 << 20):
                copy.write(chunk)
        cursor.execute(f"UPDATE {Run._meta.db_table} SET metrics_seq = %s WHERE id = %s", [(steps - 1) // 1_000 + 1, legacy.pk])
        cursor.execute(f"VACUUM ANALYZE {MetricPoint._meta.db_table}")
    catch_up_start = time.perf_counter()
    legacy_snapshot = run_snapshot(legacy)
    catch_up_ms = (time.perf_counter() - catch_up_start) * 1000
    legacy_same = {key: legacy_snapshot[key] for key in ("seq", "shift", "max_step", "series")} == {
        key: snapshot[key] for key in ("seq", "shift", "max_step", "series")
    }

    def naive() -> dict:
        seq, points, _ = metric_points_page(run, 0, max_points=10**12)  # every point, one page
        return snapshot_from_points(points, seq=seq)

    naive_ms, naive_all, naive_snapshot = _timed(naive, args.naive_repeats)
    same = {key: snapshot[key] for key in naive_snapshot} == naive_snapshot

    # Live: a new ingest batch (1,000 lines x 20 metrics, through the real service) lands
    # before each page load.
    live_all = []
    next_step = steps
    for _ in range(args.repeats):
        batch = [
            PointIn(line=step, name=name, step=step, t=1_700_000_000.0 + step * 0.8, value=(step % 97) / 97)
            for step in range(next_step, next_step + 1_000)
            for name in names
        ]
        next_step += 1_000
        ingest_metrics(run.pk, batch)
        start = time.perf_counter()
        run_snapshot_json(run)
        live_all.append((time.perf_counter() - start) * 1000)
    flush_broadcasts()
    live_snapshot = run_snapshot(run)
    live_ms = statistics.median(live_all)
    _, all_points, _ = metric_points_page(run, 0, max_points=10**12)
    live_same = {key: live_snapshot[key] for key in ("series", "shift", "max_step")} == {
        key: value for key, value in snapshot_from_points(all_points).items() if key in ("series", "shift", "max_step")
    }
    buckets = sum(len(series["b"]) for series in snapshot["series"].values())
    print(f"points: {total:,} ({len(names)} metrics x {steps:,} steps), ingested (with folding) in {ingest_s:.1f}s = {total / ingest_s:,.0f} points/s")
    print(f"grid: width {snapshot['width']} steps, {buckets:,} buckets in {len(snapshot['series'])} series, JSON {body_bytes:,} bytes")
    print(f"{'what':<40} {'median ms':>10}   all runs (ms)")
    rows = (
        ("cold: first snapshot after ingest", cold_ms, [cold_ms]),
        ("warm: selector", selector_ms, selector_all),
        ("warm: endpoint (Django + JSON)", endpoint_ms, endpoint_all),
        ("live: selector after +20k points", live_ms, live_all),
        ("catch-up: first snapshot of a COPYed run", catch_up_ms, [catch_up_ms]),
        ("naive: all points to Python", naive_ms, naive_all),
    )
    for label, median, runs in rows:
        print(f"{label:<40} {median:>10.1f}   {' '.join(f'{ms:.0f}' for ms in runs)}")
    print(f"SQL snapshot identical to the Python reference over all points: {same} (warm), {live_same} (live); "
          f"COPYed run caught up to the same snapshot: {legacy_same}")
    print(f"RESULT snapshot_1m_ms {max(cold_ms, selector_ms):.1f}")
    print(f"RESULT snapshot_1m_cold_ms {cold_ms:.1f}")
    print(f"RESULT snapshot_1m_warm_ms {selector_ms:.1f}")
    print(f"RESULT snapshot_1m_endpoint_ms {endpoint_ms:.1f}")
    print(f"RESULT snapshot_1m_live_after_20k_points_ms {live_ms:.1f}")
    print(f"RESULT snapshot_1m_catch_up_ms {catch_up_ms:.1f}")
    print(f"RESULT snapshot_1m_naive_python_ms {naive_ms:.1f}")
    print(f"RESULT snapshot_1m_speedup_vs_naive {naive_ms / selector_ms:.1f}")
    print(f"RESULT snapshot_1m_ingest_points_per_s {total / ingest_s:.0f}")
    return 0 if same and live_same and legacy_same else 1


if __name__ == "__main__":
    raise SystemExit(main())
