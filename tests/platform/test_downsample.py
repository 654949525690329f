"""The downsampling algorithm: spikes survive, re-bucketing is exact, and the page's JS agrees.

The Python reference (`downsample_oracle.py`, beside this file) is the oracle: the JS the run
page runs (`static/inflight/downsample.js`) is run under node on the same input and must give
the same bytes; the SQL side is checked against `snapshot_from_points` in `test_live_snapshot.py`.
node is Debian's `nodejs`, which `.ci/run` installs: without it the JS comparison fails rather
than skips, so CI cannot pass without running it.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path


from downsample_oracle import (  # tests/platform is on sys.path (rootdir-relative test modules)
    MAX_BUCKETS,
    DownsampleState,
    shift_for_max_step,
    snapshot_from_points,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DOWNSAMPLE_JS = REPO_ROOT / "static" / "inflight" / "downsample.js"


def _random_points(seed: int, max_step: int, names: tuple[str, ...] = ("reward/mean", "train/loss")) -> list[tuple[str, int, float, float]]:
    rng = random.Random(seed)
    points = []
    for step in range(max_step + 1):
        for name in names:
            if rng.random() < 0.8:
                points.append((name, step, 1_700_000_000.0 + step * 0.37 + rng.random() * 0.01, round(rng.gauss(0, 1), 6)))
    return points


def test_shift_keeps_at_most_max_buckets() -> None:
    assert shift_for_max_step(None) == 0
    assert shift_for_max_step(0) == 0
    assert shift_for_max_step(MAX_BUCKETS - 1) == 0
    assert shift_for_max_step(MAX_BUCKETS) == 1
    for max_step in (1_000, 1_999, 2_000, 123_456, 10**6):
        shift = shift_for_max_step(max_step)
        assert (max_step >> shift) + 1 <= MAX_BUCKETS
        assert (max_step >> (shift - 1)) + 1 > MAX_BUCKETS  # the smallest such width


def test_a_single_step_spike_survives_heavy_downsampling() -> None:
    points = [("train/grad_norm", step, float(step), 1.0) for step in range(50_000)]
    points[31_337] = ("train/grad_norm", 31_337, 31_337.0, 250.0)
    snapshot = snapshot_from_points(points)
    columns = snapshot["series"]["train/grad_norm"]
    assert len(columns["b"]) <= MAX_BUCKETS
    assert max(columns["max"]) == 250.0
    assert min(columns["min"]) == 1.0
    # the bucket's "last" is the point with the largest step in it
    assert columns["step"][-1] == 49_999


def test_incremental_order_and_duplicates_do_not_matter() -> None:
    points = _random_points(seed=1, max_step=4_321)
    fresh = snapshot_from_points(points)
    shuffled = points + points[:500]  # duplicates: a push overlapping a snapshot
    random.Random(2).shuffle(shuffled)
    state = DownsampleState()
    for point in shuffled:
        state.add_point(*point)
    assert state.to_snapshot() == fresh


def test_snapshot_plus_pushes_equals_fresh_snapshot() -> None:
    points = _random_points(seed=3, max_step=3_000)
    first = snapshot_from_points(points[:400], seq=4)  # the grid is still fine-grained here
    assert first["shift"] == 0
    state = DownsampleState.from_snapshot(json.loads(json.dumps(first)))
    rest = points[400:]
    seq = 4
    for start in range(0, len(rest), 137):
        seq += 1
        assert state.apply_batch({"type": "metrics.batch", "seq": seq, "points": [list(p) for p in rest[start:start + 137]]}) == "applied"
    assert state.shift == shift_for_max_step(3_000) > 0  # it had to re-bucket on the way
    assert state.to_snapshot() == snapshot_from_points(points, seq=seq)


def test_stale_and_gapped_batches_are_reported_not_applied() -> None:
    state = DownsampleState.from_snapshot(snapshot_from_points([("a", 1, 1.0, 1.0)], seq=10))
    assert state.apply_batch({"seq": 10, "points": [["a", 2, 2.0, 99.0]]}) == "stale"
    assert state.apply_batch({"seq": 12, "points": [["a", 2, 2.0, 99.0]]}) == "gap"
    assert state.to_snapshot()["series"]["a"]["max"] == [1.0]
    assert state.apply_batch({"seq": 11, "points": [["a", 2, 2.0, 99.0]]}) == "applied"
    assert state.seq == 11


def test_js_twin_computes_the_same_snapshot() -> None:
    """Same snapshot, same pushes (crossing two width doublings) → byte-identical result in JS and Python."""
    assert shutil.which("node"), "node runs the page's downsample.js here: install Debian's nodejs (.ci/run does)"
    points = _random_points(seed=5, max_step=4_500, names=("reward/mean", "policy_lag/max", "spec/accept_rate"))
    first = snapshot_from_points(points[:900], seq=0)
    batches = []
    rest = points[900:]
    for i, start in enumerate(range(0, len(rest), 250)):
        batches.append({"type": "metrics.batch", "seq": i + 1, "points": [list(p) for p in rest[start:start + 250]]})
    n = len(batches)
    gapped = {"type": "metrics.batch", "from_seq": n + 2, "seq": n + 2, "points": [["reward/mean", 9_000, 1.0, 7.0]]}
    overlapping = {"type": "metrics.batch", "from_seq": n - 1, "seq": n + 1, "points": batches[-1]["points"] + [["reward/mean", 9_000, 2.0, -7.0]]}
    script = (
        "const D = require(process.argv[1]);"
        "const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "const state = D.State.fromSnapshot(input.snapshot);"
        "const outcomes = input.batches.map(b => state.applyBatch(b));"
        "outcomes.push(state.applyBatch(input.batches[0]));"  # a replayed push is stale
        "outcomes.push(state.applyBatch(input.gapped));"  # a push that skips a batch is a gap
        "outcomes.push(state.applyBatch(input.overlapping));"  # coalesced, overlapping what is held
        "process.stdout.write(JSON.stringify({snapshot: state.toSnapshot(), outcomes}));"
    )
    done = subprocess.run(
        ["node", "-e", script, str(DOWNSAMPLE_JS)],
        input=json.dumps({"snapshot": first, "batches": batches, "gapped": gapped, "overlapping": overlapping}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    from_js = json.loads(done.stdout)
    python_state = DownsampleState.from_snapshot(first)
    outcomes = [python_state.apply_batch(batch) for batch in batches] + [python_state.apply_batch(batches[0])]
    outcomes += [python_state.apply_batch(gapped), python_state.apply_batch(overlapping)]
    assert from_js["outcomes"] == outcomes == ["applied"] * n + ["stale", "gap", "applied"]
    all_points = points + [("reward/mean", 9_000, 2.0, -7.0)]
    assert from_js["snapshot"] == python_state.to_snapshot() == snapshot_from_points(all_points, seq=n + 1)
    assert python_state.shift == 4  # step 9_000 forced one more doubling in both


def test_a_coalesced_push_may_overlap_but_not_skip() -> None:
    state = DownsampleState.from_snapshot(snapshot_from_points([("a", 1, 1.0, 1.0)], seq=3))
    assert state.apply_batch({"seq": 6, "from_seq": 5, "points": [["a", 9, 9.0, 5.0]]}) == "gap"
    assert state.apply_batch({"seq": 6, "from_seq": 2, "points": [["a", 1, 1.0, 1.0], ["a", 9, 9.0, 5.0]]}) == "applied"
    assert state.seq == 6
    assert state.to_snapshot() == snapshot_from_points([("a", 1, 1.0, 1.0), ("a", 9, 9.0, 5.0)], seq=6)
