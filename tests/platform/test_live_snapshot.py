"""The PostgreSQL snapshot: equal to the reference algorithm, and snapshot + pushed batches == a fresh snapshot.

The pushes are the real `metrics.batch` messages that `live_ingest.ingest_metrics` sends
through the real Redis channel layer; they are applied with `DownsampleState`, the
Python oracle (tests/platform/downsample_oracle.py) of the JS the run page uses.
"""

from __future__ import annotations

import json
import random

import pytest
from channels.layers import get_channel_layer
from django.db import connection, transaction

from downsample_oracle import DownsampleState, snapshot_from_points  # tests/platform is on sys.path
from inflight.live.folding import fold_pending_batches
from inflight.live.selectors import run_snapshot
from inflight.runs import services
from inflight.live.broadcast import batch_text, run_group
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest
from layer_loop import LayerLoop  # tests/platform is on sys.path

pytestmark = pytest.mark.django_db


def fold_new_batches(run_id: int) -> int:
    """Fold what is stored but not yet folded, as a worker may after ingest; the cursor's seq."""
    with transaction.atomic(), connection.cursor() as cursor:
        return fold_pending_batches(cursor, run_id).seq


def _batch(rng: random.Random, first_line: int, steps: range, names: tuple[str, ...]) -> list[PointIn]:
    points = []
    line = first_line
    for step in steps:
        t = 1_700_000_000.0 + step * 0.5 + rng.random()
        for name in names:
            if rng.random() < 0.85:
                points.append(PointIn(line=line, name=name, step=step, t=t, value=round(rng.gauss(0, 1), 5)))
        line += 1
    return points


def test_sql_snapshot_equals_the_reference_algorithm(owner) -> None:
    rng = random.Random(7)
    run = services.create_run(owner, "r", {})
    points = _batch(rng, 0, range(0, 2_600), ("reward/mean", "train/loss", "system/cpu_util"))
    # Same step logged twice on different lines (a restarted trainer), and an identical (step, t).
    points += [PointIn(line=10_000, name="reward/mean", step=5, t=points[0].t, value=42.0)]
    points += [PointIn(line=10_001, name="reward/mean", step=2_599, t=1.0, value=-3.0)]
    for start in range(0, len(points), 1_000):
        live_ingest.ingest_metrics(run.pk, points[start:start + 1_000])
    snapshot = run_snapshot(run)
    expected = snapshot_from_points([(p.name, p.step, p.t, p.value) for p in points], seq=snapshot["seq"])
    assert snapshot["shift"] == 2  # 2_600 steps → width 4
    assert {key: snapshot[key] for key in expected} == expected
    filtered = run_snapshot(run, names=["train/loss"])
    assert list(filtered["series"]) == ["train/loss"] and filtered["series"]["train/loss"] == expected["series"]["train/loss"]
    assert filtered["shift"] == snapshot["shift"]  # the grid comes from the whole run


def test_snapshot_plus_pushed_batches_equals_a_fresh_snapshot(owner, django_capture_on_commit_callbacks) -> None:
    rng = random.Random(11)
    run = services.create_run(owner, "r", {})
    names = ("reward/mean", "policy_lag/max", "spec/accept_rate")
    layer = get_channel_layer()
    layer_loop = LayerLoop()  # the pub/sub layer's subscriptions live on one loop
    channel = layer_loop.run(layer.new_channel())
    layer_loop.run(layer.group_add(run_group(run.pk), channel))

    live_ingest.ingest_metrics(run.pk, _batch(rng, 0, range(0, 300), names))
    page = DownsampleState.from_snapshot(run_snapshot(run))  # what the browser loaded
    assert page.seq == 1 and page.shift == 0

    line = 300
    for steps in (range(300, 900), range(900, 1_500), range(1_500, 2_400), range(2_400, 4_100)):
        with django_capture_on_commit_callbacks(execute=True):
            live_ingest.ingest_metrics(run.pk, _batch(rng, line, steps, names))
        line += len(steps)
    # a re-sent batch (same lines) stores nothing and pushes nothing
    with django_capture_on_commit_callbacks(execute=True):
        assert live_ingest.ingest_metrics(run.pk, _batch(random.Random(11), 0, range(0, 300), names)) is None

    async def receive(count: int) -> list[dict]:
        # One event loop for all receives: channels_redis keeps per-loop receive state.
        return [await layer.receive(channel) for _ in range(count)]

    messages = layer_loop.run(receive(4))
    layer_loop.close()
    assert [message["type"] for message in messages] == ["metrics.batch"] * 4
    # Each as the page receives it from the consumer (the points travel as text).
    outcomes = [page.apply_batch(json.loads(batch_text(message))) for message in messages]
    assert outcomes == ["applied"] * 4
    assert page.shift == 3  # the grid doubled three times on the way (4_099 steps → width 8)
    fresh = run_snapshot(run)
    assert page.to_snapshot() == {key: fresh[key] for key in page.to_snapshot()}
    assert page.seq == fresh["seq"] == 5


def test_incremental_snapshots_stay_equal_to_the_reference_as_the_grid_grows(owner) -> None:
    """Snapshots taken between ingests fold only new batches into the stored buckets (and
    coarsen them when the run outgrows the grid); each must equal a from-scratch computation."""
    rng = random.Random(13)
    run = services.create_run(owner, "r", {})
    names = ("reward/mean", "train/loss")
    stored: list[PointIn] = []
    line = 0
    for steps in (range(0, 10), range(10, 1_200), range(1_200, 1_250), range(1_250, 5_000), range(5_000, 5_001)):
        batch = _batch(rng, line, steps, names)
        # a late point for an early step (an evaluation logged for an old step) lands in its old bucket
        batch.append(PointIn(line=90_000 + line, name="reward/mean", step=3, t=2e9, value=rng.random()))
        line += len(steps)
        live_ingest.ingest_metrics(run.pk, batch)
        stored += batch
        if steps.start == 1_200:  # folded ahead of the page view (as the worker may do after ingest)
            assert fold_new_batches(run.pk) == 3
        snapshot = run_snapshot(run)
        expected = snapshot_from_points([(p.name, p.step, p.t, p.value) for p in stored], seq=snapshot["seq"])
        assert {key: snapshot[key] for key in expected} == expected, steps
    coarse = run_snapshot(run, names=["train/loss"], min_shift=snapshot["shift"] + 2)
    state = DownsampleState.from_snapshot(snapshot)
    state.coarsen_to(snapshot["shift"] + 2)
    assert coarse["series"]["train/loss"] == state.to_snapshot()["series"]["train/loss"]
    assert coarse["width"] == 4 * snapshot["width"]


def _summary_seq(run_id: int) -> int | None:
    from inflight.live.models import SnapshotCursor

    return SnapshotCursor.objects.filter(run_id=run_id).values_list("seq", flat=True).first()


def test_ingest_folds_each_batch_so_no_read_has_to(owner) -> None:
    """After every ingest the stored buckets already reach `metrics_seq` (no snapshot was
    read in between), across grid doublings, a re-sent and a partly re-sent batch."""
    from inflight.runs.models import Run

    rng = random.Random(17)
    run = services.create_run(owner, "r", {})
    names = ("reward/mean", "train/loss")
    stored: list[PointIn] = []
    line = 0
    for steps in (range(0, 600), range(600, 1_100), range(1_100, 3_000), range(3_000, 3_010)):
        batch = _batch(rng, line, steps, names)
        line += len(steps)
        live_ingest.ingest_metrics(run.pk, batch)
        stored += batch
        assert _summary_seq(run.pk) == Run.objects.get(pk=run.pk).metrics_seq
    # a partly re-sent batch: only its new lines count, and they are folded too
    overlap = _batch(rng, line - 5, range(3_005, 3_020), names)
    assert live_ingest.ingest_metrics(run.pk, overlap) == 5
    known = {(p.line, p.name) for p in stored}
    stored += [p for p in overlap if (p.line, p.name) not in known]
    assert _summary_seq(run.pk) == 5
    snapshot = run_snapshot(run)
    expected = snapshot_from_points([(p.name, p.step, p.t, p.value) for p in stored], seq=5)
    assert {key: snapshot[key] for key in expected} == expected


def test_a_run_stored_before_ingest_folded_is_caught_up(owner) -> None:
    """Points stored without folding (as ingest did before it folded its batches) are folded
    by the next ingest, or by the next snapshot read, whichever comes first."""
    from inflight.runs.models import MetricPoint, Run

    rng = random.Random(19)
    names = ("reward/mean", "train/loss")
    for catch_up_by in ("ingest", "read"):
        run = services.create_run(owner, f"legacy-{catch_up_by}", {})
        legacy = _batch(rng, 0, range(0, 1_500), names)
        MetricPoint.objects.bulk_create(
            [MetricPoint(run_id=run.pk, line=p.line, name=p.name, step=p.step, t=p.t, value=p.value, seq=1 + p.line // 500) for p in legacy]
        )
        Run.objects.filter(pk=run.pk).update(metrics_seq=3)
        stored = list(legacy)
        if catch_up_by == "ingest":
            batch = _batch(rng, 1_500, range(1_500, 1_600), names)
            assert live_ingest.ingest_metrics(run.pk, batch) == 4
            stored += batch
            assert _summary_seq(run.pk) == 4
        else:
            assert _summary_seq(run.pk) is None
        snapshot = run_snapshot(run)
        expected = snapshot_from_points([(p.name, p.step, p.t, p.value) for p in stored], seq=snapshot["seq"])
        assert snapshot["seq"] == (4 if catch_up_by == "ingest" else 3)
        assert {key: snapshot[key] for key in expected} == expected


def test_repeated_keys_inside_one_batch_store_the_first(owner) -> None:
    run = services.create_run(owner, "r", {})
    batch = [PointIn(0, "loss", 0, 1.0, 0.5), PointIn(0, "loss", 0, 1.0, 9.0), PointIn(1, "loss", 1, 2.0, 0.25)]
    assert live_ingest.ingest_metrics(run.pk, batch) == 1
    snapshot = run_snapshot(run)
    assert snapshot["series"]["loss"]["last"] == [0.5, 0.25]
