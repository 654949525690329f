"""Write side of the live charts: keeping each run's downsampled buckets up to date.

Every ingest batch folds its own points into the run's `SnapshotBucket`s inside the
transaction that stores them (`fold_ingest_batch`), so the buckets and their cursor
(`SnapshotCursor.seq`) always equal `Run.metrics_seq` once the batch commits. A page view
then only reads (see `selectors`): the first snapshot of a 1M-point run costs what every
later one costs, instead of folding every point at once.

Folding is exact because every aggregate (min, max, the lexicographically largest
`ARRAY[step, t, value]`) is associative and idempotent, and growing the grid merges pairs
of buckets, which equals grouping the raw points on the wider grid.

`fold_pending_batches` catches up a run whose cursor lags (runs ingested before batches
folded themselves): it reads the unfolded batches back through MetricPoint's
`(run, seq)` index.

Locking: an ingest locks the run row (seq bump) and then the cursor row; a catch-up locks
only the cursor row and reads `metrics_seq` without a lock. The order never inverts, so
the two cannot deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inflight.live.downsample import shift_for_max_step
from inflight.live.models import SnapshotBucket, SnapshotCursor
from inflight.runs.models import MetricPoint, Run

_POINTS = MetricPoint._meta.db_table
_RUNS = Run._meta.db_table
_BUCKETS = SnapshotBucket._meta.db_table
_CURSORS = SnapshotCursor._meta.db_table
# A point's columns as the model names them (the statements below bind them by position).
_POINT_COLUMNS = ", ".join(MetricPoint._meta.get_field(name).column for name in ("run", "seq", "line", "name", "step", "t", "value"))
_RETURNED = ", ".join(MetricPoint._meta.get_field(name).column for name in ("name", "step", "t", "value"))
_POINT_KEY = ", ".join(MetricPoint._meta.get_field(name).column for name in ("run", "line", "name"))

# A batch's points stored, those already there (same run, line, name) skipped; returns the stored
# ones. `%(x)b`: the arrays travel in binary over a server-side bound statement (Django's own
# cursors inline parameters as text literals, which PostgreSQL then parses: ~25% slower here).
INSERT_POINTS_RETURNING_SQL = f"""
INSERT INTO {_POINTS} ({_POINT_COLUMNS})
SELECT %(run)s, %(seq)s, * FROM unnest(
    %(lines)b::bigint[], %(names)b::varchar[], %(steps)b::bigint[], %(ts)b::float8[], %(values)b::float8[]
)
ON CONFLICT ({_POINT_KEY}) DO NOTHING
RETURNING {_RETURNED}
"""


@dataclass
class FoldCursor:
    """A locked `SnapshotCursor` row: batches 1..seq are folded, on a grid of width 2**shift."""

    run_id: int
    seq: int
    shift: int
    max_step: int | None


# Creates the cursor of a run's first batch, and locks it (DO UPDATE locks an existing row).
_LOCK_CURSOR_SQL = f"""
INSERT INTO {_CURSORS} AS c (run_id, seq, shift) VALUES (%(run)s, 0, 0)
ON CONFLICT (run_id) DO UPDATE SET seq = c.seq
RETURNING seq, shift, max_step
"""

_SAVE_CURSOR_SQL = f"UPDATE {_CURSORS} SET seq = %(seq)s, shift = %(shift)s, max_step = %(max_step)s WHERE run_id = %(run)s"

_NEW_MAX_STEP_SQL = f"SELECT max(step) FROM {_POINTS} WHERE run_id = %(run)s AND seq > %(since)s AND seq <= %(upto)s"

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

# Upsert of fresh buckets `(name, bucket, lo, hi, last)` (`{fresh}`: a table expression; `{run}`:
# the run's id, a parameter or a column of it) into the stored ones.
_UPSERT_BUCKETS = f"""
INSERT INTO {_BUCKETS} AS b (run_id, name, bucket, min_value, max_value, last_step, last_t, last_value)
SELECT {{run}}, name, bucket, lo, hi, last[1]::bigint, last[2], last[3] FROM {{fresh}}
ON CONFLICT (run_id, name, bucket) DO UPDATE SET
    min_value = LEAST(b.min_value, EXCLUDED.min_value),
    max_value = GREATEST(b.max_value, EXCLUDED.max_value),
    last_step = CASE WHEN {{newer}} THEN EXCLUDED.last_step ELSE b.last_step END,
    last_t = CASE WHEN {{newer}} THEN EXCLUDED.last_t ELSE b.last_t END,
    last_value = CASE WHEN {{newer}} THEN EXCLUDED.last_value ELSE b.last_value END
"""
_NEWER = (
    "ARRAY[EXCLUDED.last_step::float8, EXCLUDED.last_t, EXCLUDED.last_value] "
    "> ARRAY[b.last_step::float8, b.last_t, b.last_value]"
)


def _fresh_buckets(source: str, shift: str = "%(shift)s", run: str = "") -> str:
    """Points of `source` (name, step, t, value) bucketed on the grid 2**`shift`: the one statement
    of the bucket rule (min, max, last = largest (step, t, value)). `run`: "run_id, " to bucket
    several runs' points at once, each on its own grid (`shift` a column then)."""
    return (
        f"SELECT {run}name, step >> {shift} AS bucket, min(value) AS lo, max(value) AS hi, "
        f"max(ARRAY[step::float8, t, value]) AS last FROM {source} GROUP BY {run}name, step >> {shift}"
    )


# Fold the stored points of batches (since, upto] (the catch-up path).
_FOLD_STORED_SQL = _UPSERT_BUCKETS.format(
    run="%(run)s", fresh=f"({_fresh_buckets(f'{_POINTS} WHERE run_id = %(run)s AND seq > %(since)s AND seq <= %(upto)s')}) AS fresh",
    newer=_NEWER,
)

_STORED_FRESH = f"({_fresh_buckets('stored')}) AS fresh"  # a batch's own stored points, bucketed


def insert_and_fold_sql(insert_points_returning: str) -> str:
    """One statement that stores a batch, folds exactly the points it stored and moves the
    cursor to the batch (`%(seq)s`) — one round trip for the whole write.

    `insert_points_returning` is the caller's `INSERT … ON CONFLICT DO NOTHING RETURNING
    name, step, t, value` (its own placeholders must be named); duplicates return no row,
    so they are not folded twice (harmless anyway) and do not count. The statement returns
    `(stored points, their largest step)`. Valid only while the batch cannot move the grid:
    the caller checks that the batch's largest step keeps `shift`.
    """
    return (
        f"WITH stored AS ({insert_points_returning}), "
        f"folded AS ({_UPSERT_BUCKETS.format(run='%(run)s', fresh=_STORED_FRESH, newer=_NEWER)}), "
        f"moved AS (UPDATE {_CURSORS} SET seq = %(seq)s, max_step = GREATEST(max_step, (SELECT max(step) FROM stored)) "
        "WHERE run_id = %(run)s AND EXISTS (SELECT 1 FROM stored)) "
        "SELECT count(*), max(step) FROM stored"
    )


# One statement that stores and folds the batches of several runs at once and takes their seqs,
# for a writer that knows each run's cursor from the run's own last batch (a worker's supervisors:
# only the run's own ingests it). A run's batch does anything only if that knowledge still holds —
# its `metrics_seq` and its cursor's seq are its `prev`, its grid its `shift` — and no line of it is
# stored yet (a re-send goes the transactional way, which pushes only the new part); the other
# runs' batches go on regardless. Arrays: `runs`/`prevs`/`shifts` one entry per run, the point
# columns one per point, with its run in `point_runs`. Returns `(run, seq)` for each run whose batch
# was stored. In autocommit it is its own transaction: one round trip and one commit for all the
# runs whose lines a worker process read meanwhile — one run per statement cost 3x the CPU per
# metrics line (bench/RESULTS.md, 2026-11-29). It locks the cursor rows before the run rows, the
# other way round from `fold_ingest_batch`: two ingests of one run at once (never one supervisor's)
# could deadlock, which PostgreSQL ends by failing one (its lines are sent again).
GUARDED_BATCH_INGEST_SQL = (
    "WITH batch AS (SELECT * FROM unnest(%(runs)b::bigint[], %(prevs)b::bigint[], %(shifts)b::int[]) AS b(run_id, prev, shift)), "
    "points AS (SELECT * FROM unnest(%(point_runs)b::bigint[], %(lines)b::bigint[], %(names)b::varchar[], %(steps)b::bigint[], "
    "%(ts)b::float8[], %(values)b::float8[]) AS u(run_id, line, name, step, t, value)), "
    f"guard AS (SELECT c.run_id FROM {_CURSORS} c JOIN batch b ON c.run_id = b.run_id AND c.seq = b.prev AND c.shift = b.shift "
    "ORDER BY c.run_id FOR UPDATE OF c), "
    "resent AS (SELECT DISTINCT u.run_id FROM (SELECT DISTINCT run_id, line FROM points) AS u "
    f"WHERE EXISTS (SELECT 1 FROM {_POINTS} p WHERE p.run_id = u.run_id AND p.line = u.line)), "
    f"bump AS (UPDATE {_RUNS} r SET metrics_seq = r.metrics_seq + 1 FROM batch b WHERE r.id = b.run_id AND r.metrics_seq = b.prev "
    "AND b.run_id IN (SELECT run_id FROM guard) AND b.run_id NOT IN (SELECT run_id FROM resent) "
    "RETURNING r.id AS run_id, r.metrics_seq AS seq, b.shift), "
    f"stored AS (INSERT INTO {_POINTS} ({_POINT_COLUMNS}) SELECT u.run_id, bump.seq, u.line, u.name, u.step, u.t, u.value "
    f"FROM points u JOIN bump ON bump.run_id = u.run_id ON CONFLICT ({_POINT_KEY}) DO NOTHING RETURNING run_id, {_RETURNED}), "
    f"fresh AS ({_fresh_buckets('stored JOIN bump USING (run_id)', shift='bump.shift', run='run_id, ')}), "
    f"folded AS ({_UPSERT_BUCKETS.format(run='fresh.run_id', fresh='fresh', newer=_NEWER)}), "
    "reached AS (SELECT run_id, max(step) AS max_step FROM stored GROUP BY run_id), "
    f"moved AS (UPDATE {_CURSORS} c SET seq = bump.seq, max_step = GREATEST(c.max_step, reached.max_step) "
    "FROM bump JOIN reached ON reached.run_id = bump.run_id WHERE c.run_id = bump.run_id) "
    "SELECT run_id, seq FROM bump"
)


def read_cursor(cursor: Any, run_id: int) -> FoldCursor | None:
    cursor.execute(f"SELECT seq, shift, max_step FROM {_CURSORS} WHERE run_id = %(run)s", {"run": run_id})
    row = cursor.fetchone()
    if row is None:
        return None
    return FoldCursor(run_id=run_id, seq=int(row[0]), shift=int(row[1]), max_step=None if row[2] is None else int(row[2]))


def lock_cursor(cursor: Any, run_id: int) -> FoldCursor:
    cursor.execute(_LOCK_CURSOR_SQL, {"run": run_id})
    seq, shift, max_step = cursor.fetchone()
    return FoldCursor(run_id=run_id, seq=int(seq), shift=int(shift), max_step=None if max_step is None else int(max_step))


def save_cursor(cursor: Any, state: FoldCursor) -> None:
    cursor.execute(_SAVE_CURSOR_SQL, {"run": state.run_id, "seq": state.seq, "shift": state.shift, "max_step": state.max_step})


def fold_stored_batches(cursor: Any, state: FoldCursor, upto: int) -> FoldCursor:
    """Fold the stored points of batches `state.seq+1 .. upto` (cursor row locked by the caller)."""
    if upto <= state.seq:
        return state
    cursor.execute(_NEW_MAX_STEP_SQL, {"run": state.run_id, "since": state.seq, "upto": upto})
    new_max = cursor.fetchone()[0]
    if new_max is not None and (state.max_step is None or new_max > state.max_step):
        state.max_step = int(new_max)
    # A catch-up of a big run groups every point: keep the aggregation in memory (the
    # default 4MB would spill the planner's sort to disk).
    cursor.execute("SET LOCAL work_mem = '64MB'")
    shift = max(state.shift, shift_for_max_step(state.max_step))
    if shift > state.shift:
        cursor.execute(_COARSEN_SQL, {"run": state.run_id, "d": shift - state.shift})
        state.shift = shift
    cursor.execute(_FOLD_STORED_SQL, {"run": state.run_id, "shift": state.shift, "since": state.seq, "upto": upto})
    state.seq = upto
    save_cursor(cursor, state)
    return state


def fold_pending_batches(cursor: Any, run_id: int) -> FoldCursor:
    """Lock the run's cursor and fold every committed batch it lacks; the lock lasts until commit.

    Once `metrics_seq` reads S every batch <= S has committed (a batch takes its seq by
    updating the run row, a lock held until it commits); later batches fold themselves
    after this transaction releases the cursor.
    """
    state = lock_cursor(cursor, run_id)
    cursor.execute(f"SELECT metrics_seq FROM {_RUNS} WHERE id = %(run)s", {"run": run_id})
    return fold_stored_batches(cursor, state, int(cursor.fetchone()[0]))


def fold_ingest_batch(
    cursor: Any, run_id: int, seq: int, batch_max_step: int, insert_points_returning: str, params: dict[str, Any]
) -> int:
    """Store batch `seq` of a run and fold it into the buckets, in the caller's transaction
    (which holds the run row lock of the seq bump). Returns how many points were new.

    The common case is one statement (`insert_and_fold_sql`). When the cursor lags (a run
    ingested before batches folded themselves) or the batch may widen the grid, the points
    are stored first and then folded from the table, exactly as a catch-up does.
    """
    state = lock_cursor(cursor, run_id)
    grid_kept = shift_for_max_step(max(batch_max_step, state.max_step or 0)) <= state.shift
    if state.seq == seq - 1 and grid_kept:
        cursor.execute(insert_and_fold_sql(insert_points_returning), {**params, "shift": state.shift})
        return int(cursor.fetchone()[0])
    cursor.execute(f"WITH stored AS ({insert_points_returning}) SELECT count(*) FROM stored", params)
    stored = int(cursor.fetchone()[0])
    if stored:
        fold_stored_batches(cursor, state, seq)
    return stored
