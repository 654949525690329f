"""Read side of the live charts: downsampled snapshots computed in PostgreSQL.

A snapshot is, per metric, `GROUP BY step >> shift` with min, max and the
lexicographically largest `ARRAY[step, t, value]` (PostgreSQL compares float8
arrays element by element: exactly the (step, t, value) order of
`static/inflight/downsample.js`). The buckets are kept up to date by the ingest itself
(`folding.fold_ingest_batch`, in the transaction that stores each batch), so a
request only reads them.

Consistency without locks: the read is ONE statement, so it sees one database
snapshot in which the buckets, their cursor and `Run.metrics_seq` were committed
together; it is used only when the cursor equals `metrics_seq`. A run whose cursor
lags (batches stored before ingest folded them) is caught up under the cursor lock
first (`folding.fold_pending_batches`) and then read while that lock is held.
The snapshot thus holds exactly batches 1..seq — the cursor from which the client
continues with pushes.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from django.db import connection, transaction

from inflight.live.folding import fold_pending_batches
from inflight.live.models import SnapshotBucket, SnapshotCursor
from inflight.runs.models import Run

_RUNS = Run._meta.db_table
_BUCKETS = SnapshotBucket._meta.db_table
_CURSORS = SnapshotCursor._meta.db_table

# The whole read is this one statement (one database snapshot): the run's cursor, only if it
# equals `metrics_seq`, and its buckets as JSON built in PostgreSQL — one text value instead
# of ~100k Python floats (PostgreSQL 12+ prints float8 in shortest round-trip form, so
# nothing is rounded). No row: the cursor lags or does not exist yet.
# `{rows}` yields (name, bucket, lo, hi, last_step, last_t, last_value) and may use the
# summary's columns `s.shift` (stored grid) and `s.out_shift` (requested grid).
_READ_JSON_SQL = f"""
WITH summary AS (
    SELECT c.seq, c.shift, c.max_step, GREATEST(c.shift, %(min_shift)s::int) AS out_shift
    FROM {_CURSORS} c JOIN {_RUNS} r ON r.id = c.run_id
    WHERE c.run_id = %(run)s AND c.seq = r.metrics_seq
)
SELECT json_build_object(
    'run', %(run)s::bigint, 'seq', s.seq, 'shift', s.out_shift, 'width', 1::bigint << s.out_shift,
    'max_step', s.max_step,
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
            FROM ({{rows}}) AS r GROUP BY name
        ) AS per_series
    ), '{{{{}}}}'::json)
)::text
FROM summary s
"""

_STORED_ROWS = f"""
SELECT name, bucket, min_value AS lo, max_value AS hi, last_step, last_t, last_value
FROM {_BUCKETS} WHERE run_id = %(run)s {{name_filter}}
"""

# Rows on a coarser grid than the stored one (the compare page's shared grid).
_COARSER_ROWS = f"""
SELECT name, bucket, lo, hi, last[1]::bigint AS last_step, last[2] AS last_t, last[3] AS last_value FROM (
    SELECT name, bucket >> (s.out_shift - s.shift) AS bucket, min(min_value) AS lo, max(max_value) AS hi,
           max(ARRAY[last_step::float8, last_t, last_value]) AS last
    FROM {_BUCKETS} WHERE run_id = %(run)s {{name_filter}}
    GROUP BY name, bucket >> (s.out_shift - s.shift)
) AS coarse
"""


def _read_snapshot_json(run_id: int, names: list[str] | None, min_shift: int) -> str | None:
    name_filter = "AND name = ANY(%(names)s)" if names is not None else ""
    # The stored grid needs no regrouping; a coarser one is asked for by the compare page only.
    rows = (_STORED_ROWS if min_shift <= 0 else _COARSER_ROWS).format(name_filter=name_filter)
    with connection.cursor() as cursor:
        cursor.execute(_READ_JSON_SQL.format(rows=rows), {"run": run_id, "min_shift": max(0, min_shift), "names": names})
        row = cursor.fetchone()
    return None if row is None else row[0]


def run_snapshot_json(run: Run, names: Iterable[str] | None = None, min_shift: int = 0) -> str:
    """Downsampled series of `run` up to its current `metrics_seq`, as JSON text.

    `{"run", "seq", "shift", "width", "max_step", "series": {name: {"b", "min", "max",
    "step", "t", "last"}}}` — the format `static/inflight/downsample.js` holds.
    The grid is chosen from the largest step of the whole run (not only of `names`),
    so a filtered snapshot lies on the same grid as the full one; `min_shift` asks
    for a coarser grid (the compare page puts several runs on one grid).
    """
    names = sorted(set(names)) if names is not None else None
    text = _read_snapshot_json(run.pk, names, int(min_shift))
    if text is not None:
        return text
    with transaction.atomic():
        # Lagging (or never ingested): catch up, then read while the cursor lock keeps
        # ingests from moving it — the read then finds cursor == metrics_seq.
        with connection.cursor() as cursor:
            fold_pending_batches(cursor, run.pk)
        text = _read_snapshot_json(run.pk, names, int(min_shift))
    if text is None:  # cannot happen while the cursor lock is held; say so rather than serve a wrong cursor
        raise RuntimeError(f"run {run.pk}: snapshot cursor does not match metrics_seq after a locked catch-up")
    return text


def run_snapshot(run: Run, names: Iterable[str] | None = None, min_shift: int = 0) -> dict[str, Any]:
    """`run_snapshot_json` parsed: for Python callers and tests."""
    return json.loads(run_snapshot_json(run, names, min_shift))
