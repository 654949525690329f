"""Read side of the live charts: downsampled snapshots computed in PostgreSQL.

A snapshot is, per metric, `GROUP BY step >> shift` with min, max and the
lexicographically largest `ARRAY[step, t, value]` (PostgreSQL compares float8
arrays element by element: exactly the (step, t, value) order of
`downsample.merge_buckets`). Rather than scanning every point of the run on
every page load, the buckets live in `SnapshotBucket` and each request first
folds in only the batches stored since the last one (`seq` > cursor, found
through MetricPoint's `(run, seq)` index). Folding is exact because every
aggregate is associative and idempotent; growing the grid merges pairs of
buckets, which equals grouping the raw points on the wider grid.

Consistency: a batch takes its `seq` by updating the run row (a row lock held
until it commits), so once `metrics_seq` reads S every batch <= S has committed.
Batches that commit later have seq > S and are left for the next request, so
the snapshot holds exactly batches 1..S — the cursor from which the client
continues with pushes.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from django.db import connection, transaction

from inflight.live.downsample import shift_for_max_step
from inflight.live.models import SnapshotBucket, SnapshotCursor
from inflight.runs.models import MetricPoint, Run

_POINTS = MetricPoint._meta.db_table
_RUNS = Run._meta.db_table
_BUCKETS = SnapshotBucket._meta.db_table
_CURSORS = SnapshotCursor._meta.db_table

_NEW_MAX_STEP_SQL = f"SELECT max(step) FROM {_POINTS} WHERE run_id = %s AND seq > %s AND seq <= %s"

# Merge pairs (2**d at once) of the run's buckets: the grid doubled d times.
_COARSEN_SQL = f"""
WITH old AS (DELETE FROM {_BUCKETS} WHERE run_id = %(run)s RETURNING *),
merged AS (
    SELECT name, bucket >> %(d)s AS bucket, min(min_value) AS lo, max(max_value) AS hi,
           max(ARRAY[last_step::float8, last_t, last_value]) AS last
    FROM old GROUP BY name, bucket >> %(d)s
)
INSERT INTO {_BUCKETS} (run_id, name, bucket, min_value, max_value, last_step, last_t, last_value)
SELECT %(run)s, name, bucket, lo, hi, last[1]::bigint, last[2], last[3] FROM merged
"""

# Fold the points of batches (since, upto] into the buckets.
_FOLD_SQL = f"""
INSERT INTO {_BUCKETS} AS b (run_id, name, bucket, min_value, max_value, last_step, last_t, last_value)
SELECT %(run)s, name, bucket, lo, hi, last[1]::bigint, last[2], last[3] FROM (
    SELECT name, step >> %(shift)s AS bucket, min(value) AS lo, max(value) AS hi,
           max(ARRAY[step::float8, t, value]) AS last
    FROM {_POINTS}
    WHERE run_id = %(run)s AND seq > %(since)s AND seq <= %(upto)s
    GROUP BY name, step >> %(shift)s
) AS fresh
ON CONFLICT (run_id, name, bucket) DO UPDATE SET
    min_value = LEAST(b.min_value, EXCLUDED.min_value),
    max_value = GREATEST(b.max_value, EXCLUDED.max_value),
    last_step = CASE WHEN {{newer}} THEN EXCLUDED.last_step ELSE b.last_step END,
    last_t = CASE WHEN {{newer}} THEN EXCLUDED.last_t ELSE b.last_t END,
    last_value = CASE WHEN {{newer}} THEN EXCLUDED.last_value ELSE b.last_value END
""".format(
    newer="ARRAY[EXCLUDED.last_step::float8, EXCLUDED.last_t, EXCLUDED.last_value] "
    "> ARRAY[b.last_step::float8, b.last_t, b.last_value]"
)

# The read builds the JSON in PostgreSQL: one text value instead of ~100k Python floats
# (PostgreSQL 12+ prints float8 in shortest round-trip form, so nothing is rounded).
# `{{rows}}` yields (name, bucket, lo, hi, last_step, last_t, last_value).
_READ_JSON_SQL = """
SELECT json_build_object(
    'run', %(run)s::bigint, 'seq', %(seq)s::bigint, 'shift', %(shift)s::int, 'width', %(width)s::bigint,
    'max_step', %(max_step)s::bigint,
    'series', COALESCE((
        SELECT json_object_agg(name, columns ORDER BY name) FROM (
            SELECT name, json_build_object(
                'b', array_agg(bucket ORDER BY bucket),
                'min', array_agg(lo ORDER BY bucket),
                'max', array_agg(hi ORDER BY bucket),
                'step', array_agg(last_step ORDER BY bucket),
                't', array_agg(last_t ORDER BY bucket),
                'last', array_agg(last_value ORDER BY bucket)
            ) AS columns
            FROM ({rows}) AS r GROUP BY name
        ) AS per_series
    ), '{{}}'::json)
)::text
"""

_STORED_ROWS = f"""
SELECT name, bucket, min_value AS lo, max_value AS hi, last_step, last_t, last_value
FROM {_BUCKETS} WHERE run_id = %(run)s {{name_filter}}
"""

# Rows on a coarser grid than the stored one (the compare page's shared grid).
_COARSER_ROWS = f"""
SELECT name, bucket, lo, hi, last[1]::bigint AS last_step, last[2] AS last_t, last[3] AS last_value FROM (
    SELECT name, bucket >> %(d)s AS bucket, min(min_value) AS lo, max(max_value) AS hi,
           max(ARRAY[last_step::float8, last_t, last_value]) AS last
    FROM {_BUCKETS} WHERE run_id = %(run)s {{name_filter}}
    GROUP BY name, bucket >> %(d)s
) AS coarse
"""


def _bring_up_to_date(run_id: int) -> SnapshotCursor:
    """Fold every committed batch into the run's buckets; returns the cursor (locked until commit)."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {_CURSORS} (run_id, seq, shift) VALUES (%s, 0, 0) ON CONFLICT DO NOTHING", [run_id])
    # One request at a time folds a run's batches; the others wait here, then find little to do.
    state = SnapshotCursor.objects.select_for_update().get(run_id=run_id)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT metrics_seq FROM {_RUNS} WHERE id = %s", [run_id])
        upto = int(cursor.fetchone()[0])
        if upto <= state.seq:
            return state
        cursor.execute(_NEW_MAX_STEP_SQL, [run_id, state.seq, upto])
        new_max = cursor.fetchone()[0]
        if new_max is not None and (state.max_step is None or new_max > state.max_step):
            state.max_step = int(new_max)
        # The first fold of a big run groups every point: keep the aggregation in memory
        # (the default 4MB would spill the planner's sort to disk).
        cursor.execute("SET LOCAL work_mem = '64MB'")
        shift = max(state.shift, shift_for_max_step(state.max_step))
        if shift > state.shift:
            cursor.execute(_COARSEN_SQL, {"run": run_id, "d": shift - state.shift})
            state.shift = shift
        cursor.execute(_FOLD_SQL, {"run": run_id, "shift": state.shift, "since": state.seq, "upto": upto})
    state.seq = upto
    state.save(update_fields=["seq", "shift", "max_step"])
    return state


def fold_new_batches(run_id: int) -> int:
    """Fold the batches stored since the last snapshot into the run's buckets; returns the cursor seq.

    Cheap when called after every ingest batch (it reads only that batch), and it keeps the
    first page view of a large run from paying for the whole run at once.
    """
    with transaction.atomic():
        return _bring_up_to_date(run_id).seq


def run_snapshot_json(run: Run, names: Iterable[str] | None = None, min_shift: int = 0) -> str:
    """Downsampled series of `run` up to its current `metrics_seq`, as JSON text.

    `{"run", "seq", "shift", "width", "max_step", "series": {name: {"b", "min", "max",
    "step", "t", "last"}}}` — the format of `downsample.DownsampleState.to_snapshot`.
    The grid is chosen from the largest step of the whole run (not only of `names`),
    so a filtered snapshot lies on the same grid as the full one; `min_shift` asks
    for a coarser grid (the compare page puts several runs on one grid).
    """
    names = sorted(set(names)) if names is not None else None
    with transaction.atomic():
        state = _bring_up_to_date(run.pk)
        shift = max(state.shift, int(min_shift))
        name_filter = "AND name = ANY(%(names)s)" if names is not None else ""
        rows = (_STORED_ROWS if shift == state.shift else _COARSER_ROWS).format(name_filter=name_filter)
        params = {
            "run": run.pk, "seq": state.seq, "shift": shift, "width": 1 << shift, "max_step": state.max_step,
            "d": shift - state.shift, "names": names,
        }
        with connection.cursor() as cursor:
            cursor.execute(_READ_JSON_SQL.format(rows=rows), params)
            return cursor.fetchone()[0]


def run_snapshot(run: Run, names: Iterable[str] | None = None, min_shift: int = 0) -> dict[str, Any]:
    """`run_snapshot_json` parsed: for Python callers and tests."""
    return json.loads(run_snapshot_json(run, names, min_shift))
