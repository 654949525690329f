"""Python oracle of the run page's downsampler (`static/inflight/downsample.js`): tests and benches only.

The product computes snapshots in PostgreSQL (`inflight.live.selectors`, `inflight.live.folding`)
and applies pushes in the browser (the JS); this reference implementation is what both are
checked against: `test_downsample.py` runs the JS under node on the same input and compares,
`test_live_snapshot.py` compares the SQL snapshot, `bench/snapshot.py` times the naive path.

A bucket keeps [min, max, last_step, last_t, last_value], "last" being the largest
(step, t, value) triple; every operation is associative, commutative and idempotent, so
snapshot + pushes equals a fresh snapshot. The grid (`shift_for_max_step`) is the product's own
(`inflight.live.downsample`), imported here, not copied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from inflight.live.downsample import MAX_BUCKETS, shift_for_max_step

__all__ = ["MAX_BUCKETS", "Bucket", "DownsampleState", "SeriesState", "merge_buckets", "series_columns",
           "shift_for_max_step", "snapshot_from_points"]

# One bucket: [min, max, last_step, last_t, last_value].
Bucket = list[float]


def _later(step_a: float, t_a: float, value_a: float, step_b: float, t_b: float, value_b: float) -> bool:
    """True if point a sorts after point b in (step, t, value) order."""
    if step_a != step_b:
        return step_a > step_b
    if t_a != t_b:
        return t_a > t_b
    return value_a > value_b


def merge_buckets(a: Bucket, b: Bucket) -> Bucket:
    """The bucket holding the points of both a and b."""
    later = a if _later(a[2], a[3], a[4], b[2], b[3], b[4]) else b
    return [min(a[0], b[0]), max(a[1], b[1]), later[2], later[3], later[4]]


@dataclass
class SeriesState:
    """Buckets of one series keyed by bucket index."""

    buckets: dict[int, Bucket] = field(default_factory=dict)


@dataclass
class DownsampleState:
    """What a chart page holds: the grid, the buckets of each series and how far it reaches (`seq`)."""

    shift: int = 0
    max_step: int | None = None
    seq: int = 0
    series: dict[str, SeriesState] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any]) -> DownsampleState:
        state = cls(shift=int(snapshot["shift"]), max_step=snapshot["max_step"], seq=int(snapshot["seq"]))
        for name, columns in snapshot["series"].items():
            buckets = {}
            for i, index in enumerate(columns["b"]):
                buckets[int(index)] = [columns["min"][i], columns["max"][i], columns["step"][i], columns["t"][i], columns["last"][i]]
            state.series[name] = SeriesState(buckets)
        return state

    def coarsen_to(self, shift: int) -> None:
        """Re-bucket every series onto a grid of width 2**shift (merging pairs each doubling)."""
        while self.shift < shift:
            for series in self.series.values():
                merged: dict[int, Bucket] = {}
                for index, bucket in series.buckets.items():
                    parent = index >> 1
                    merged[parent] = merge_buckets(merged[parent], bucket) if parent in merged else bucket
                series.buckets = merged
            self.shift += 1

    def add_point(self, name: str, step: int, t: float, value: float) -> None:
        step = int(step)
        if self.max_step is None or step > self.max_step:
            self.max_step = step
            self.coarsen_to(shift_for_max_step(step))
        series = self.series.setdefault(name, SeriesState())
        index = step >> self.shift
        point: Bucket = [value, value, step, t, value]
        existing = series.buckets.get(index)
        series.buckets[index] = merge_buckets(existing, point) if existing is not None else point

    def apply_batch(self, message: dict[str, Any]) -> str:
        """Apply one `metrics.batch` push. Returns "applied", "stale" (already in the state) or "gap" (refetch).

        A push covers the ingest batches `from_seq..seq` (the consumer may coalesce several;
        `from_seq` defaults to `seq`). It may overlap what the state holds — applying a point
        twice changes nothing — but must not leave a batch out.
        """
        seq = int(message["seq"])
        first = int(message.get("from_seq", seq))
        if seq <= self.seq:
            return "stale"
        if first > self.seq + 1:
            return "gap"
        for name, step, t, value in message["points"]:
            self.add_point(name, step, t, value)
        self.seq = seq
        return "applied"

    def to_snapshot(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "shift": self.shift,
            "width": 1 << self.shift,
            "max_step": self.max_step,
            "series": {name: series_columns(sorted(self.series[name].buckets.items())) for name in sorted(self.series)},
        }


def series_columns(rows: Iterable[tuple[int, Bucket]]) -> dict[str, list[float]]:
    """Columnar JSON form of (bucket index, bucket) rows in bucket order — compact and plotly-ready."""
    columns: dict[str, list[float]] = {"b": [], "min": [], "max": [], "step": [], "t": [], "last": []}
    for index, (low, high, step, t, value) in rows:
        columns["b"].append(index)
        columns["min"].append(low)
        columns["max"].append(high)
        columns["step"].append(int(step))
        columns["t"].append(t)
        columns["last"].append(value)
    return columns


def snapshot_from_points(points: Iterable[tuple[str, int, float, float]], seq: int = 0) -> dict[str, Any]:
    """Reference downsampling of raw points (what the SQL selector computes), for tests and small runs."""
    points = list(points)
    max_step = max((int(p[1]) for p in points), default=None)
    state = DownsampleState(shift=shift_for_max_step(max_step), max_step=max_step, seq=seq)
    for name, step, t, value in points:
        state.add_point(name, step, t, value)
    return state.to_snapshot()
