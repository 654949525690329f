"""Rollout ingest: samples/s into PostgreSQL at the demo's rate and at 100x it, the p95 push
latency of metrics while rollouts flow, and the storage of a 10-minute demo run's rollouts.

Starts a private embedded PostgreSQL + Redis (fsync on, as the demo), migrates, then:

  rate        `inflight.rollouts.services.ingest_rollouts` fed the way the worker feeds it (one
              call per 250 ms tail of stream/rollouts.jsonl) at the demo's stream rate (64
              samples per step, 200 steps in 85 s: ~150 samples/s, so ~38 lines a tail)
              and at 100x (~3,800 lines a tail), with the demo's store settings (every 5th step)
              and with every sample kept (the worst case: each line becomes a row); the figure
              is lines ingested per second of ingest time (capacity), and the time share of
              the 250 ms tail spent on them.
  latency     `bench/ingest.py`'s WebSocket client on the live consumer while metric batches
              arrive every 250 ms, and at the same time a thread ingests rollouts at 100x the
              demo's rate with every sample kept: arrival → client p95 (goal <= 200 ms).
  storage     a 10-minute demo run's stream replayed (6,400 samples shaped like the demo's:
              34-token prompts, 21-48-token responses, two versions on sequences that span an
              update) through the demo's settings: rows kept and bytes in PostgreSQL (table +
              indexes + TOAST), and the bound `max_stored` x the largest row. `--stream FILE`
              stores a recorded run's stream instead (a real 10-minute demo run's lines).

    .venv/bin/python bench/rollouts.py [--seconds 20] [--stream DIR/stream/rollouts.jsonl] [--smoke]

--smoke: --seconds 0.5 (two 250 ms tails per rate row), --latency-batches 4, --storage-run-s 5.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import threading
import time

from benchlib import REPO_ROOT, live_run, parse_bench_args, platform_services, ws_latency  # first: it puts the checkout on sys.path

DEMO_SAMPLES_PER_STEP = 64
# The demo's stream rate, measured: 200 steps of 64 samples in 85 s (2026-11-24 00:12, 2-core CPU,
# after shared decode rows; 124 s earlier that evening, 371 steps in 10 minutes before that).
DEMO_SAMPLES_PER_S = 64 * 200 / 85
TAIL_S = 0.25


def sample(line: int, rng: random.Random, vocab: int) -> dict:
    length = rng.randint(21, 48)
    step = line // DEMO_SAMPLES_PER_STEP + 1
    switch = rng.randint(1, length - 1) if rng.random() < 0.3 else length
    versions = [max(0, step - 2)] * switch + [max(0, step - 1)] * (length - switch)
    reward = float(rng.random() < 0.6)
    return {
        "sample_id": f"g{line // 8}-{line % 8}", "group_id": f"g{line // 8}", "prompt_id": f"p{line // 8}",
        "prompt_token_ids": [rng.randrange(vocab) for _ in range(34)], "completion_token_ids": [rng.randrange(vocab) for _ in range(length)],
        "behaviour_logprobs": [-rng.random() * 3 for _ in range(length)], "token_versions": versions,
        "reward": reward, "success": reward > 0.5, "advantage": reward - 0.6, "finish_reason": "stop",
        "metadata": {"epoch": 0, "extracted": str(rng.randint(0, 400))},
    }


def make_run(owner, keep_every: int, max_stored: int = 5000):
    from inflight.runs.models import Run

    config = {"trainer": {"samples_per_step": DEMO_SAMPLES_PER_STEP}, "model": {"path": "var/models/tiny"},
              "monitoring": {"rollouts": {"keep_every_n_steps": keep_every, "max_stored": max_stored}}}
    # Not "running": the bench makes more runs than a user may have active (the limit counts them).
    return Run.objects.create(owner=owner, name="bench-rollouts", config=config, status="succeeded")


def ingest_rate(owner, decoder, lines_per_tail: int, keep_every: int, seconds: float, vocab: int) -> tuple[float, float, int]:
    """(lines/s of ingest time, share of each 250 ms tail spent ingesting, rows stored)."""
    from inflight.rollouts.models import StoredRollout
    from inflight.rollouts.services import ingest_rollouts

    rng = random.Random(0)
    run = make_run(owner, keep_every)
    # At least two tails (the smoke's 0.5 s): a rate over one call would be its first call's alone.
    tails = max(2, int(seconds / TAIL_S))
    line, busy = 0, 0.0
    for _ in range(tails):
        records = [(n, sample(n, rng, vocab)) for n in range(line, line + lines_per_tail)]
        line += lines_per_tail
        started = time.perf_counter()
        ingest_rollouts(run.pk, records, decoder)
        busy += time.perf_counter() - started
    return line / busy, busy / (tails * TAIL_S), StoredRollout.objects.filter(run=run).count()


def storage(owner, decoder, vocab: int, recorded: list[dict] | None = None, run_s: float = 600.0) -> tuple[int, int, int]:
    """(rows kept, bytes of those rows incl. TOAST and their index entries, bytes of the largest row).
    `recorded`: a real run's stream lines instead of the replayed demo-shaped ones (`run_s` seconds of the demo's)."""
    from django.db import connection

    from inflight.rollouts.models import StoredRollout
    from inflight.rollouts.services import ingest_rollouts

    rng = random.Random(1)
    table = StoredRollout._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM FULL {table}")
        cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        before = cursor.fetchone()[0]
    StoredRollout.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM FULL {table}")
        cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        empty = cursor.fetchone()[0]
    run = make_run(owner, keep_every=5)
    total = len(recorded) if recorded is not None else int(DEMO_SAMPLES_PER_S * run_s)
    per_tail = max(1, round(DEMO_SAMPLES_PER_S * TAIL_S))
    for start in range(0, total, per_tail):
        lines = range(start, min(total, start + per_tail))
        ingest_rollouts(run.pk, [(n, recorded[n] if recorded is not None else sample(n, rng, vocab)) for n in lines], decoder)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM FULL {table}")
        cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        after = cursor.fetchone()[0]
        cursor.execute(f"SELECT max(pg_column_size(t.*)) FROM {table} t WHERE run_id = %s", [run.pk])
        largest = cursor.fetchone()[0]
    del before
    return StoredRollout.objects.filter(run=run).count(), after - empty, largest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="Simulated run time per rate measurement.")
    parser.add_argument("--latency-batches", type=int, default=60, help="Metric batches sent to the WebSocket client.")
    parser.add_argument("--stream", default=None,
                        help="A recorded run's stream/rollouts.jsonl for the storage figure (e.g. of a 10-minute "
                             "`python -m rl_core run examples/tiny-cpu.yaml --out DIR`) instead of the replayed one.")
    parser.add_argument("--storage-run-s", type=float, default=600.0,
                        help="Seconds of the demo's stream replayed for the storage figure (its RESULT names say 10min).")
    args = parse_bench_args(parser, smoke={"seconds": 0.5, "latency_batches": 4, "storage_run_s": 5.0})
    recorded = None
    if args.stream:
        import json
        from pathlib import Path

        recorded = [json.loads(line) for line in Path(args.stream).read_text().splitlines() if line.strip()]

    with platform_services("rollouts"):
        from django.contrib.auth import get_user_model

        from inflight.rollouts.tokens import decoder_for_model

        owner = get_user_model().objects.create_user(f"bench-{os.getpid()}")
        decoder = decoder_for_model(str(REPO_ROOT / "var" / "models" / "tiny"))
        vocab = decoder.tokenizer.get_vocab_size() if decoder.tokenizer is not None else 1000

        demo_tail = max(1, round(DEMO_SAMPLES_PER_S * TAIL_S))
        burst_tail = round(100 * DEMO_SAMPLES_PER_S * TAIL_S)
        rows = []
        for label, per_tail in (("demo", demo_tail), ("100x", burst_tail)):
            for keep_every in (5, 1):
                rate, share, stored = ingest_rate(owner, decoder, per_tail, keep_every, args.seconds, vocab)
                rows.append((label, per_tail, keep_every, rate, share, stored))
        print(f"{'rate':>6} {'lines/tail':>10} {'keep every':>10} {'lines/s':>10} {'tail busy':>10} {'rows':>7}")
        for label, per_tail, keep_every, rate, share, stored in rows:
            print(f"{label:>6} {per_tail:>10} {keep_every:>10} {rate:>10,.0f} {share:>9.1%} {stored:>7}")

        # Metric push latency while rollouts flow at 100x: with the default store policy (every
        # 5th step's groups become rows) and with every sample kept (the worst case).
        from inflight.rollouts.services import ingest_rollouts

        def latency_with_flow(keep_every: int) -> tuple[float, float, float, float]:
            stop = threading.Event()
            flowing = {"lines": 0}

            def flow() -> None:
                from django.db import connection

                rng = random.Random(2)
                run = make_run(owner, keep_every=keep_every, max_stored=1_000_000)
                line = 0
                while not stop.is_set():
                    started = time.monotonic()
                    ingest_rollouts(run.pk, [(n, sample(n, rng, vocab)) for n in range(line, line + burst_tail)], decoder)
                    line += burst_tail
                    flowing["lines"] = line
                    time.sleep(max(0.0, TAIL_S - (time.monotonic() - started)))
                connection.close()

            flower = threading.Thread(target=flow)
            flower.start()
            flow_started = time.monotonic()
            with live_run(owner, f"bench-latency-with-rollouts-{keep_every}") as latency_run:
                latencies, _ = asyncio.run(ws_latency(owner, latency_run, args.latency_batches, lines_per_batch=25, interval_s=TAIL_S))
            flow_s = time.monotonic() - flow_started
            stop.set()
            flower.join()
            latencies.sort()
            p95 = latencies[int(0.95 * (len(latencies) - 1))]
            return flowing["lines"] / flow_s, statistics.median(latencies), p95, latencies[-1]

        p95_by_keep = {}
        for keep_every in (5, 1):
            lines_per_s, p50, p95, worst = latency_with_flow(keep_every)
            p95_by_keep[keep_every] = p95
            print(f"metrics ws latency while {lines_per_s:,.0f} rollout lines/s flowed (every {keep_every} step(s) kept): "
                  f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {worst:.1f} ms")

        kept, used, largest = storage(owner, decoder, vocab, recorded, args.storage_run_s)
        source = f"recorded stream {args.stream}" if recorded is not None else f"{args.storage_run_s / 60:g}-minute demo run, replayed"
        samples = len(recorded) if recorded is not None else int(DEMO_SAMPLES_PER_S * args.storage_run_s)
        print(f"{source} ({samples} samples, every 5th step kept): {kept} rows, "
              f"{used / 1e6:.2f} MB in PostgreSQL ({used / max(1, kept):,.0f} B/row incl. indexes); largest row {largest:,} B")
        by = {(label, keep): rate for label, _, keep, rate, _, _ in rows}
        print(f"RESULT rollouts_ingest_lines_per_s_demo {by[('demo', 5)]:.0f}")
        print(f"RESULT rollouts_ingest_lines_per_s_100x {by[('100x', 5)]:.0f}")
        print(f"RESULT rollouts_ingest_rows_per_s_100x_all_kept {by[('100x', 1)]:.0f}")
        print(f"RESULT ws_latency_p95_ms_with_rollouts {p95_by_keep[5]:.1f}")
        print(f"RESULT ws_latency_p95_ms_with_rollouts_all_kept {p95_by_keep[1]:.1f}")
        print(f"RESULT rollouts_storage_10min_demo_mb {used / 1e6:.2f}")
        print(f"RESULT rollouts_rows_10min_demo {kept}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
