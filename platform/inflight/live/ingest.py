"""A metrics line's one way through the platform: worker → here → folding → broadcast.

The worker's reporter (`workers.tasks.PlatformReporter`) hands this module a run's new
metrics.jsonl lines (`ingest_metric_lines`; `ingest_metrics` takes points already split, for the
benches and tests that make their own). Here they become column arrays (never one object per
value), are stored and folded into the run's snapshot buckets by one statement
(`live.folding`: the narrow `MetricPoint` table, idempotent per (run, line, name)), and after the
commit pushed to the run's Channels group as one `metrics.batch` (`live.broadcast.push_on_commit`).
Nothing comes back the other way: folding and broadcast know nothing of ingest.

A batch is whatever one poll of the run found: every line written since the last poll, one
statement and one commit for all of them (at 200 live runs a statement per line was what ingest
could not keep up with, bench/platform_scale.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import psycopg
from django.db import connection, transaction

from inflight.live.broadcast import push_on_commit, run_group
from inflight.live.downsample import shift_for_max_step
from inflight.live.folding import GUARDED_INGEST_SQL, INSERT_POINTS_RETURNING_SQL, fold_ingest_batch, read_cursor
from inflight.runs.models import MetricPoint, Run

NAME_MAX = MetricPoint._meta.get_field("name").max_length  # a longer metric name is cut to fit its column
_RUNS = Run._meta.db_table
_POINTS = MetricPoint._meta.db_table
_METRICS_SEQ = Run._meta.get_field("metrics_seq").column
_RECORD_KEYS = frozenset({"t", "step"})  # a metrics.jsonl object's fields that are not metrics


@dataclass(frozen=True)
class PointIn:
    """One metric value as read from metrics.jsonl; `line` is its idempotency key."""

    line: int
    name: str
    step: int
    t: float
    value: float


def points_from_metrics_record(line: int, record: dict[str, Any]) -> list[PointIn]:
    """Split one metrics.jsonl object `{"t", "step", "<metric>": value, ...}` into points."""
    t = float(record.get("t", time.time()))
    step = int(record.get("step", 0))
    points = []
    for key, value in record.items():
        if key in _RECORD_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        points.append(PointIn(line=line, name=key, step=step, t=t, value=float(value)))
    return points


@dataclass
class MetricsIngestState:
    """One run's batch counter and snapshot cursor as its supervisor last left them (`seq`: the
    run's `metrics_seq` = the cursor's seq; `shift`, `max_step`: the cursor's grid). With it a
    batch usually costs one statement (`folding.GUARDED_INGEST_SQL`), which checks in the database
    that this is still so; when not (first batch, a grid that must widen, a re-send, a resume's
    rewind), the batch goes the transactional way and the state is read again."""

    seq: int | None = None  # None: not known yet
    shift: int = 0
    max_step: int | None = None


@dataclass
class PointColumns:
    """A batch as the statement binds it: one array per column, finite values only, the first
    of each (line, name) — a key repeated inside one statement would be a conflict PostgreSQL
    cannot settle (nor should a batch carry one)."""

    lines: list[int]
    names: list[str]
    steps: list[int]
    ts: list[float]
    values: list[float]

    @classmethod
    def empty(cls) -> PointColumns:
        return cls([], [], [], [], [])

    def add(self, seen: set[tuple[int, str]], line: int, name: str, step: int, t: float, value: float) -> None:
        name = name[:NAME_MAX]
        if (line, name) in seen or not (math.isfinite(value) and math.isfinite(t)):
            return
        seen.add((line, name))
        self.lines.append(line)
        self.names.append(name)
        self.steps.append(step)
        self.ts.append(t)
        self.values.append(value)

    @classmethod
    def of_points(cls, points: Iterable[PointIn]) -> PointColumns:
        columns, seen = cls.empty(), set()
        for p in points:
            columns.add(seen, p.line, p.name, p.step, p.t, p.value)
        return columns

    @classmethod
    def of_records(cls, records: Sequence[tuple[int, dict[str, Any]]], skipped: list[tuple[int, str]] | None = None) -> PointColumns:
        """The points of metrics.jsonl lines as `points_from_metrics_record` splits them, straight
        into columns; a line that cannot be read (a non-numeric step or t) is left out whole and
        named in `skipped`, as (line, reason)."""
        columns, seen = cls.empty(), set()
        now = time.time()
        for line, record in records:
            try:
                t = float(record.get("t", now))
                step = int(record.get("step", 0))
            except (TypeError, ValueError) as exc:
                if skipped is not None:
                    skipped.append((line, str(exc)))
                continue
            for key, value in record.items():
                if key in _RECORD_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                columns.add(seen, line, key, step, t, float(value))
        return columns

    def points(self) -> list[list[Any]]:
        """The batch as a `metrics.batch` push carries it: [name, step, t, value] per point."""
        return [list(point) for point in zip(self.names, self.steps, self.ts, self.values)]

    def params(self, run_id: int) -> dict[str, Any]:
        return {"run": run_id, "lines": self.lines, "names": self.names, "steps": self.steps, "ts": self.ts, "values": self.values}


def ingest_metrics(run_id: int, points: Sequence[PointIn], state: MetricsIngestState | None = None) -> int | None:
    """Store a batch of points, skipping those already stored (same line + name), and fold it
    into the run's downsampled snapshot in the same transaction (`live.folding`), so a page view
    never pays for folding.

    Returns the run's new `metrics_seq`, or None when every point was a duplicate (then the
    sequence is not bumped and nothing is broadcast). Non-finite values are dropped.
    `state`: the run's `MetricsIngestState` kept by its supervisor (one statement per batch
    while it holds; kept up to date here)."""
    return ingest_columns(run_id, PointColumns.of_points(points), state)


def ingest_metric_lines(run_id: int, records: Sequence[tuple[int, dict[str, Any]]], state: MetricsIngestState | None = None,
                        skipped: list[tuple[int, str]] | None = None) -> int | None:
    """`ingest_metrics` for metrics.jsonl lines as the worker read them ((line number, object)
    pairs): all of them one batch, one statement while `state` holds."""
    return ingest_columns(run_id, PointColumns.of_records(records, skipped), state)


def ingest_columns(run_id: int, columns: PointColumns, state: MetricsIngestState | None = None) -> int | None:
    if not columns.lines:
        return None
    if state is not None:
        seq = _ingest_guarded(run_id, columns, state)
        if seq is not None:
            return seq
    seq = _ingest_in_transaction(run_id, columns)
    if state is not None:
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            known = read_cursor(cursor, run_id)
            cursor.execute(f"SELECT {_METRICS_SEQ} FROM {_RUNS} WHERE id = %(run)s", {"run": run_id})
            row = cursor.fetchone()
        if known is not None and row is not None and known.seq == int(row[0]):
            state.seq, state.shift, state.max_step = known.seq, known.shift, known.max_step
        else:
            state.seq = None  # not settled (a page's catch-up may still fold): the next batch goes this way too
    return seq


def _ingest_guarded(run_id: int, columns: PointColumns, state: MetricsIngestState) -> int | None:
    """The one-statement way (see MetricsIngestState); the new seq, or None if it did nothing."""
    batch_max_step = max(columns.steps)
    if state.seq is None or shift_for_max_step(max(batch_max_step, state.max_step or 0)) > state.shift:
        return None
    params = {**columns.params(run_id), "prev": state.seq, "shift": state.shift}
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        # Prepared once per connection: the statement is the same for every batch of every run,
        # and planning its six parts anew was a share of PostgreSQL's CPU on every poll.
        cursor.execute(GUARDED_INGEST_SQL, params, prepare=True)
        seq, _stored = cursor.fetchone()
    if seq is None:
        return None
    state.seq, state.max_step = int(seq), max(batch_max_step, state.max_step if state.max_step is not None else batch_max_step)
    push_on_commit(run_group(run_id), {"type": "metrics.batch", "seq": int(seq), "points": columns.points()})
    return int(seq)


def _ingest_in_transaction(run_id: int, columns: PointColumns) -> int | None:
    with transaction.atomic():
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            # Locks the run row, so concurrent batches of one run get distinct, ordered seqs.
            cursor.execute(
                f"UPDATE {_RUNS} SET {_METRICS_SEQ} = {_METRICS_SEQ} + 1 WHERE id = %(run)s RETURNING {_METRICS_SEQ}",
                {"run": run_id},
            )
            row = cursor.fetchone()
            if row is None:
                raise Run.DoesNotExist(f"run {run_id} does not exist")
            seq = int(row[0])
            params = {**columns.params(run_id), "seq": seq}
            inserted = fold_ingest_batch(cursor, run_id, seq, max(columns.steps), INSERT_POINTS_RETURNING_SQL, params)
            if inserted == len(columns.lines):
                stored = columns.points()  # the common case: all new
            elif inserted > 0:
                # Part of the batch was stored before (a re-send overlapping new lines): push only the new part.
                cursor.execute(
                    f"SELECT name, step, t, value FROM {_POINTS} WHERE run_id = %(run)s AND seq = %(seq)s ORDER BY line, name",
                    {"run": run_id, "seq": seq},
                )
                stored = [list(row) for row in cursor.fetchall()]
            else:
                stored = []
        if not stored:
            transaction.set_rollback(True)
            return None
        push_on_commit(run_group(run_id), {"type": "metrics.batch", "seq": seq, "points": stored})
    return seq
