"""A metrics line's one way through the platform: worker → here → folding → broadcast.

The worker's reporter (`workers.tasks.PlatformReporter`) hands this module a run's new
metrics.jsonl lines (`submit_metric_lines`; `ingest_metric_lines` waits for the result;
`ingest_metrics` takes points already split, for the benches and tests that make their own). Here
they become column arrays (never one object per value), are stored and folded into the run's
snapshot buckets by one statement (`live.folding`: the narrow `MetricPoint` table, idempotent per
(run, line, name)), and after the commit pushed to the run's Channels group as one `metrics.batch`
(`live.broadcast.push_on_commit`). Nothing comes back the other way: folding and broadcast know
nothing of ingest.

A run's batch is whatever one poll of it found: every line written since the last poll. The
process's `MetricsWriter` writes the batches of all its runs that wait at once in one statement
and one commit (at 200 live runs a statement per line, then per run, was what ingest could not keep
up with: bench/platform_scale.py, bench/RESULTS.md).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import psycopg
from django.db import connection, transaction

from inflight.live.broadcast import metrics_batch, push_on_commit, run_group
from inflight.live.downsample import shift_for_max_step
from inflight.live.folding import GUARDED_BATCH_INGEST_SQL, INSERT_POINTS_RETURNING_SQL, fold_ingest_batch, read_cursor
from inflight.runs.models import MetricPoint, Run

logger = logging.getLogger(__name__)

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
    batch usually costs a share of one statement (`folding.GUARDED_BATCH_INGEST_SQL`, written with
    other runs' by `MetricsWriter`), which checks in the database
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
    return submit_columns(run_id, columns, state).result()


def submit_metric_lines(run_id: int, records: Sequence[tuple[int, dict[str, Any]]], state: MetricsIngestState,
                        skipped: list[tuple[int, str]] | None = None) -> PendingMetrics:
    """`ingest_metric_lines` without waiting where it can: while `state` holds (and the caller is
    not in a transaction) the batch is handed to this process's `MetricsWriter`, which writes it
    with the other runs' batches waiting then and pushes it; `PendingMetrics.ready()` says when,
    `.result()` gives the seq (or raises the write's error: the caller sends the lines again)."""
    return submit_columns(run_id, PointColumns.of_records(records, skipped), state)


def submit_columns(run_id: int, columns: PointColumns, state: MetricsIngestState | None) -> PendingMetrics:
    pending = PendingMetrics(run_id, columns, state)
    if not columns.lines:
        pending.done.set()
    elif state is None or state.seq is None or shift_for_max_step(max(max(columns.steps), state.max_step or 0)) > state.shift:
        pending.guarded = False  # the transactional way, when the result is asked for
        pending.done.set()
    elif connection.in_atomic_block:
        # Inside the caller's transaction (a test's): its own connection must write it, alone.
        _write_guarded([pending])
        pending.done.set()
    else:
        _writer.submit(pending)
    return pending


@dataclass
class PendingMetrics:
    """A run's batch handed to ingest: `MetricsWriter` writes it (`guarded`), or `result()` does,
    in the caller's thread, the transactional way (a first batch, a grid that must widen, a state
    that no longer holds, a caller inside a transaction)."""

    run_id: int
    columns: PointColumns
    state: MetricsIngestState | None
    guarded: bool = True
    seq: int | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    settled: bool = False
    stored_at: float | None = None  # when the statement that stored it returned (Unix s)
    handed_at: float = field(default_factory=time.monotonic)  # when its supervisor handed it over

    def ready(self) -> bool:
        return self.done.is_set()

    def result(self) -> int | None:
        """The run's new `metrics_seq`, None when every point was a duplicate; waits if not ready."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        if self.settled or not self.columns.lines:
            return self.seq
        if not self.guarded or self.seq is None:
            self.seq = _ingest_and_settle(self.run_id, self.columns, self.state)
            self.stored_at = time.time()
        self.settled = True
        return self.seq


def _ingest_and_settle(run_id: int, columns: PointColumns, state: MetricsIngestState | None) -> int | None:
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


class MetricsWriter:
    """One per worker process: writes the guarded batches of all the runs it ingests, every batch
    waiting at that moment in one statement (`folding.GUARDED_BATCH_INGEST_SQL`), on a thread and
    database connection of its own, and pushes each stored batch. A supervisor hands its run's
    lines over and goes on with its other work (or other runs) instead of waiting for its own
    round trip and commit: at 200 live runs, one statement per run's line was 3x the CPU per line
    (bench/RESULTS.md, 2026-11-29). A statement's error is every batch's in it; each supervisor
    sends its lines again. Recreated after a fork (its thread does not survive one)."""

    MAX_POINTS = 20_000  # per statement (one batch larger than that is still written whole)
    # A statement waits this long after the first batch for others to join it: with no wait most
    # statements carried one run (2.3 on average at 200 live runs), each line paying its own
    # statement's share again (bench/RESULTS.md, 2026-11-29). A push is this much later at most.
    GATHER_S = 0.025
    IDLE_CLOSE_S = 1.0  # its connection is closed after this long without a batch
    # Behind: a statement's oldest batch took longer than this from its hand-over to its commit
    # (GATHER_S and a statement's ~15 ms on a quiet machine are well under it); said by `behind()`
    # for BEHIND_FOR_S after (a moment on time between late statements would let a burst of bulk
    # writes in). Writes that may lag (the rollout viewer's rows) wait meanwhile.
    BEHIND_S = 0.06
    BEHIND_FOR_S = 3.0

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._waiting: list[PendingMetrics] = []
        self._first_at = 0.0  # when the oldest waiting batch came
        self._pid = 0
        self._behind_at = -math.inf  # when a statement last came out behind (monotonic s)

    def behind(self) -> bool:
        """Whether this process's metrics are late reaching the database (see BEHIND_S)."""
        return time.monotonic() - self._behind_at < self.BEHIND_FOR_S

    def note_written(self, batches: list[PendingMetrics]) -> None:
        now = time.monotonic()
        if batches and now - min(pending.handed_at for pending in batches) > self.BEHIND_S:
            self._behind_at = now

    def submit(self, pending: PendingMetrics) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._waiting = os.getpid(), []
                threading.Thread(target=self._run, name="inflight-metrics-writer", daemon=True).start()
            if not self._waiting:
                self._first_at = time.monotonic()
            self._waiting.append(pending)
            self._lock.notify()

    def _take(self) -> list[PendingMetrics]:
        with self._lock:
            if not self._lock.wait_for(lambda: bool(self._waiting), self.IDLE_CLOSE_S):
                # Quiet: no connection held open for nothing (a database that is dropped or
                # restarted, a test database torn down, must not find this thread still on it).
                connection.close()
                self._lock.wait_for(lambda: bool(self._waiting))
            self._lock.wait_for(lambda: sum(len(p.columns.lines) for p in self._waiting) >= self.MAX_POINTS,
                                self._first_at + self.GATHER_S - time.monotonic())
            taken, points = 0, 0
            while taken < len(self._waiting) and (taken == 0 or points < self.MAX_POINTS):
                points += len(self._waiting[taken].columns.lines)
                taken += 1
            batches, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return batches

    def _run(self) -> None:
        while True:
            batches: list[PendingMetrics] = []
            try:
                batches = self._take()
                _write_guarded(batches)
                self.note_written(batches)
            except BaseException as exc:  # noqa: BLE001 - each batch's caller raises it (and sends its lines again)
                connection.close()  # the next write reconnects
                logger.warning("metrics write of %d runs failed: %s", len(batches), exc)
                for pending in batches:
                    pending.error = exc
            finally:
                for pending in batches:
                    pending.done.set()


def _write_guarded(batches: list[PendingMetrics]) -> None:
    params: dict[str, list[Any]] = {key: [] for key in ("runs", "prevs", "shifts", "point_runs", "lines", "names", "steps", "ts", "values")}
    for pending in batches:
        assert pending.state is not None
        params["runs"].append(pending.run_id)
        params["prevs"].append(pending.state.seq)
        params["shifts"].append(pending.state.shift)
        columns = pending.columns
        params["point_runs"] += [pending.run_id] * len(columns.lines)
        for key in ("lines", "names", "steps", "ts", "values"):
            params[key] += getattr(columns, key)
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        # Prepared once per connection: the statement is the same for every write, and planning its
        # parts anew was a share of PostgreSQL's CPU on every poll.
        cursor.execute(GUARDED_BATCH_INGEST_SQL, params, prepare=True)
        seqs = {int(run_id): int(seq) for run_id, seq in cursor.fetchall()}
    stored_at = time.time()
    for pending in batches:
        seq = seqs.get(pending.run_id)
        if seq is None:
            continue  # its guard did not hold: result() goes the transactional way
        state, batch_max_step = pending.state, max(pending.columns.steps)
        assert state is not None
        state.seq, state.max_step = seq, max(batch_max_step, state.max_step if state.max_step is not None else batch_max_step)
        pending.seq, pending.settled, pending.stored_at = seq, True, stored_at
        push_on_commit(run_group(pending.run_id), metrics_batch(seq, pending.columns.points()))


_writer = MetricsWriter()


def metrics_behind() -> bool:
    """Whether this process's metrics are late reaching the database (`MetricsWriter.behind`): a
    write that may lag (the rollout viewer's rows) waits."""
    return _writer.behind()


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
        push_on_commit(run_group(run_id), metrics_batch(seq, stored))
    return seq
