"""The live-push sender keeps up with many runs: each run's pushes go out in order, different
runs' pushes overlap. Sent one round trip after another, a worker ingesting 200 runs fell a minute
behind and its last pushes were never sent (bench/platform_scale.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from inflight.live import broadcast


class SlowLayer:
    """A channel layer whose every group_send takes a Redis round trip on a busy machine."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.delivered: dict[str, list[int]] = {}
        self.in_flight: set[str] = set()
        self.overlapping_same_group = 0

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if group in self.in_flight:
            self.overlapping_same_group += 1
        self.in_flight.add(group)
        await asyncio.sleep(self.delay_s)
        self.in_flight.discard(group)
        self.delivered.setdefault(group, []).append(message["seq"])


def test_pushes_of_many_runs_overlap_and_each_run_keeps_its_order(monkeypatch) -> None:
    layer = SlowLayer(delay_s=0.05)
    monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(broadcast, "_broadcaster", broadcast._Broadcaster())
    groups, pushes = 40, 3
    started = time.monotonic()
    for seq in range(1, pushes + 1):
        for run in range(groups):
            broadcast.push(f"run-{run}", {"type": "metrics.batch", "seq": seq})
    assert broadcast.flush_broadcasts(timeout_s=30)
    elapsed = time.monotonic() - started
    # One after another: 40 x 3 x 50 ms = 6 s. Overlapping across runs: a few round trips.
    assert elapsed < 2.0, elapsed
    assert layer.delivered == {f"run-{run}": [1, 2, 3] for run in range(groups)}
    assert layer.overlapping_same_group == 0


def test_a_runs_waiting_metric_batches_go_out_as_one_push_that_says_which_batches(monkeypatch) -> None:
    """When a run's pushes queue up behind a slow channel layer, consecutive metrics batches go
    out merged (`from_seq`..`seq`, as the consumer merges them); a gap, or another kind of push
    in between, is never merged over: the page must still see it."""
    layer = SlowLayer(delay_s=0.2)
    sent: list[dict[str, Any]] = []
    real_send = layer.group_send

    async def recording(group: str, message: dict[str, Any]) -> None:
        sent.append(message)
        await real_send(group, message)

    layer.group_send = recording  # type: ignore[method-assign]
    monkeypatch.setattr(broadcast, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(broadcast, "_broadcaster", broadcast._Broadcaster())
    batch = lambda seq: {"type": "metrics.batch", "seq": seq, "points": [["loss", seq, 1.0, float(seq)]]}  # noqa: E731
    broadcast.push("run-1", batch(1))  # goes out at once; the rest wait behind it
    time.sleep(0.05)
    for message in (batch(2), batch(3), {"type": "run.status", "seq": 0, "status": "running"}, batch(4), batch(6), batch(7)):
        broadcast.push("run-1", message)
    assert broadcast.flush_broadcasts(timeout_s=30)
    assert [(m["type"], m.get("from_seq", m["seq"]), m["seq"]) for m in sent] == [
        ("metrics.batch", 1, 1), ("metrics.batch", 2, 3), ("run.status", 0, 0), ("metrics.batch", 4, 4), ("metrics.batch", 6, 7),
    ]
    assert [p[1] for p in broadcast.batch_points(sent[1])] == [2, 3] and [p[1] for p in broadcast.batch_points(sent[4])] == [6, 7]
