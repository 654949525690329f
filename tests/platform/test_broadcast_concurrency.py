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
            broadcast._group_send(f"run-{run}", {"type": "metrics.batch", "seq": seq})
    assert broadcast.flush_broadcasts(timeout_s=30)
    elapsed = time.monotonic() - started
    # One after another: 40 x 3 x 50 ms = 6 s. Overlapping across runs: a few round trips.
    assert elapsed < 2.0, elapsed
    assert layer.delivered == {f"run-{run}": [1, 2, 3] for run in range(groups)}
    assert layer.overlapping_same_group == 0
