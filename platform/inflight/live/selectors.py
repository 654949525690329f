"""Read side of the live charts: downsampled snapshots computed in PostgreSQL.

The snapshot is `GROUP BY name, step >> shift` over the run's points, with
min, max and the lexicographically largest `ARRAY[step, t, value]` per bucket
(PostgreSQL compares float8 arrays element by element, which is exactly the
(step, t, value) order of `downsample.merge_buckets`). One pass, hash
aggregation, no sort of the raw points.

Consistency: a batch takes its `seq` by updating the run row (a row lock held
until it commits), so once `metrics_seq` reads S every batch <= S has committed.
Batches that commit while the snapshot runs have seq > S; filtering `seq <= S`
drops them, so the snapshot holds exactly batches 1..S — the cursor from which
the client continues with pushes.
"""

from __future__ import annotations

from typing import Any, Iterable

from django.db import connection

from inflight.live.downsample import series_columns, shift_for_max_step
from inflight.runs.models import MetricPoint, Run

_POINTS = MetricPoint._meta.db_table
_RUNS = Run._meta.db_table

_MAX_STEP_SQL = f"SELECT max(step) FROM {_POINTS} WHERE run_id = %s AND seq <= %s"

_BUCKETS_SQL = f"""
SELECT name, step >> %s AS bucket, min(value), max(value), max(ARRAY[step::float8, t, value])
FROM {_POINTS}
WHERE run_id = %s AND seq <= %s {{name_filter}}
GROUP BY name, bucket
ORDER BY name, bucket
"""


def run_snapshot(run: Run, names: Iterable[str] | None = None, min_shift: int = 0) -> dict[str, Any]:
    """Downsampled series of `run` up to its current `metrics_seq`.

    The grid is chosen from the largest step of the whole run (not only of `names`),
    so a filtered snapshot lies on the same grid as the full one; `min_shift` forces
    a coarser grid (the compare page puts several runs on one grid).
    """
    names = sorted(set(names)) if names is not None else None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT metrics_seq FROM {_RUNS} WHERE id = %s", [run.pk])
        row = cursor.fetchone()
        if row is None:
            raise Run.DoesNotExist(f"run {run.pk} does not exist")
        seq = int(row[0])
        cursor.execute(_MAX_STEP_SQL, [run.pk, seq])
        max_step = cursor.fetchone()[0]
        max_step = None if max_step is None else int(max_step)
        shift = max(shift_for_max_step(max_step), int(min_shift))
        series: dict[str, dict[str, list[float]]] = {}
        if names is not None and not names:
            rows: list[tuple[Any, ...]] = []
        else:
            name_filter = "AND name = ANY(%s)" if names is not None else ""
            params: list[Any] = [shift, run.pk, seq] + ([names] if names is not None else [])
            cursor.execute(_BUCKETS_SQL.format(name_filter=name_filter), params)
            rows = cursor.fetchall()
    grouped: dict[str, list[tuple[int, list[float]]]] = {}
    for name, bucket, low, high, last in rows:
        grouped.setdefault(name, []).append((int(bucket), [low, high, int(last[0]), last[1], last[2]]))
    for name, bucket_rows in grouped.items():
        series[name] = series_columns(bucket_rows)
    return {"run": run.pk, "seq": seq, "shift": shift, "width": 1 << shift, "max_step": max_step, "series": series}
