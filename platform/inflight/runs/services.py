"""Every write to runs and what they report (HackSoftware style: views and tasks only call these).

Live updates go to Channels groups after the transaction commits:
- `run-<id>`: `{"type": "metrics.batch", "seq", "points": [[name, step, t, value], ...]}` and
  `{"type": "run.status", "run_id", "status", "error"}`;
- `runs-user-<owner id>`: `{"type": "run.status", "run_id", "status", "error"}`.
A broadcast that fails (Redis away) is logged and dropped: the database already holds the
data and clients re-sync from a snapshot, so nothing recorded is lost.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence

import psycopg
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.utils import timezone
from pydantic import ValidationError

from inflight.live.folding import fold_ingest_batch
from inflight.runs.models import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATUSES,
    EvalProblemResult,
    EvalScore,
    MetricPoint,
    Run,
    RunQueue,
    RunStatus,
    Worker,
)
from rl_core.config import RunConfig, field_errors

logger = logging.getLogger(__name__)


class IllegalTransition(Exception):
    """A status change the run state machine forbids (e.g. succeeded → running)."""


class InvalidRunConfig(ValueError):
    """A run config refused by RunConfig; `errors` maps dotted field paths to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{field}: {', '.join(messages)}" for field, messages in errors.items()))


@dataclass(frozen=True)
class PointIn:
    """One metric value as read from metrics.jsonl; `line` is its idempotency key."""

    line: int
    name: str
    step: int
    t: float
    value: float


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def user_runs_group(user_id: int) -> str:
    return f"runs-user-{user_id}"


class _Broadcaster:
    """Channels sends from sync code: in order, on one event loop thread per process, and
    without making the caller wait for Redis.

    `async_to_sync(layer.group_send)` would run each send on a fresh event loop, and the Redis
    layer keeps its connections per loop, so every push would open a new connection (~7 ms vs
    <1 ms here). Ingest only queues its push (after its transaction committed) and returns: a
    2,000-point push costs a few ms of serialization and Redis round trips that need not delay
    the next batch. One task sends the queue in order, so a client never sees batch 5 before
    batch 4. If Redis stalls and more than `MAX_UNSENT` pushes wait, new ones are dropped
    (logged): the database holds the data and a client that sees the seq gap refetches its
    snapshot. Recreated after a fork (the loop thread does not survive it)."""

    MAX_UNSENT = 1000
    SEND_TIMEOUT_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self._pid = 0
        self._unsent = 0

    def _started_loop(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, dict[str, Any]]]]:
        # Called with the lock held.
        if self._loop is None or self._queue is None or self._pid != os.getpid():
            loop = asyncio.new_event_loop()
            queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
            self._loop, self._queue, self._pid, self._unsent = loop, queue, os.getpid(), 0
            threading.Thread(target=loop.run_forever, name="inflight-broadcast", daemon=True).start()
            asyncio.run_coroutine_threadsafe(self._send_in_order(queue), loop)
        return self._loop, self._queue

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Queue one group_send; returns at once."""
        with self._lock:
            if self._unsent >= self.MAX_UNSENT:
                logger.warning("%d pushes waiting for the channel layer; dropping %s to %s", self._unsent, message.get("type"), group)
                return
            loop, queue = self._started_loop()
            self._unsent += 1
        loop.call_soon_threadsafe(queue.put_nowait, (group, message))

    async def _send_in_order(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        while True:
            group, message = await queue.get()
            try:
                layer = get_channel_layer()
                if layer is not None:
                    await asyncio.wait_for(layer.group_send(group, message), self.SEND_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a live push must never undo or block a recorded write
                logger.warning("could not broadcast %s to %s", message.get("type"), group, exc_info=True)
            finally:
                with self._lock:
                    self._unsent -= 1
                    self._lock.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued push was handed to the channel layer (or failed); False on timeout."""
        with self._lock:
            if self._pid != os.getpid():
                return True
            return self._lock.wait_for(lambda: self._unsent == 0, timeout_s)


_broadcaster = _Broadcaster()
# A short-lived process (a management command, a bench) still delivers its last pushes.
atexit.register(_broadcaster.flush)


def _group_send(group: str, message: dict[str, Any]) -> None:
    try:
        _broadcaster.send(group, message)
    except Exception:  # noqa: BLE001 - a live push must never undo or block a recorded write
        logger.warning("could not broadcast %s to %s", message.get("type"), group, exc_info=True)


def flush_broadcasts(timeout_s: float = 5.0) -> bool:
    """Block until this process's queued live pushes were sent; False if they did not go in time."""
    return _broadcaster.flush(timeout_s)


# ---------------------------------------------------------------- creating and dispatching


def validate_run_config(config_dict: Any) -> RunConfig:
    if not isinstance(config_dict, dict):
        raise InvalidRunConfig({"config": ["must be a mapping of config sections"]})
    try:
        return RunConfig.model_validate(config_dict)
    except ValidationError as exc:
        raise InvalidRunConfig(field_errors(exc)) from exc


@transaction.atomic
def create_run(owner: AbstractBaseUser, name: str, config_dict: dict[str, Any]) -> Run:
    """Validate through RunConfig, store the resolved config, queue it on `cpu` or `gpu` after commit."""
    name = (name or "").strip() or str(config_dict.get("name", "") if isinstance(config_dict, dict) else "")
    if isinstance(config_dict, dict) and name:
        config_dict = {**config_dict, "name": name}
    config = validate_run_config(config_dict)
    run = Run.objects.create(
        owner=owner,
        name=config.name,
        config=config.model_dump(mode="json"),
        queue=RunQueue.GPU if config.needs_gpu else RunQueue.CPU,
        status=RunStatus.QUEUED,
    )
    run.run_dir = str(settings.INFLIGHT_RUNS_DIR / str(run.pk))
    run.save(update_fields=["run_dir"])
    transaction.on_commit(lambda: dispatch_run(run.pk, run.queue))
    transaction.on_commit(lambda: _broadcast_status(run))
    return run


EXECUTE_RUN_TASK = "inflight.execute_run"


def dispatch_run(run_id: int, queue: str) -> None:
    # Sent through the project's Celery app (configured from Django settings), never Celery's
    # default app, which a web process would otherwise use. Imported here: the Celery app
    # module sets up Django, so it cannot be imported while settings load.
    from workers.celery_app import app

    try:
        app.send_task(EXECUTE_RUN_TASK, args=[run_id], queue=queue, retry=False)
    except Exception as exc:  # noqa: BLE001 - the broker is away: say so on the run instead of hiding it
        logger.error("could not queue run %s on %s", run_id, queue, exc_info=True)
        transition_run(run_id, RunStatus.FAILED, error=f"could not queue the run on '{queue}': {exc}")


# ---------------------------------------------------------------- status


def _broadcast_status(run: Run) -> None:
    message = {"type": "run.status", "run_id": run.pk, "status": run.status, "error": run.error}
    _group_send(run_group(run.pk), message)
    _group_send(user_runs_group(run.owner_id), message)


@transaction.atomic
def transition_run(
    run_id: int,
    new_status: str,
    *,
    error: str | None = None,
    worker_name: str | None = None,
    run_dir: str | None = None,
) -> Run:
    """Move a run to `new_status`; raises IllegalTransition if the state machine forbids it."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if new_status not in RunStatus.values:
        raise IllegalTransition(f"unknown status {new_status!r}")
    if new_status not in ALLOWED_TRANSITIONS[run.status]:
        raise IllegalTransition(f"run {run_id}: {run.status} → {new_status} is not allowed")
    now = timezone.now()
    run.status = new_status
    fields = ["status"]
    if new_status == RunStatus.STARTING and run.started_at is None:
        run.started_at = now
        fields.append("started_at")
    if new_status in TERMINAL_STATUSES:
        run.finished_at = now
        fields.append("finished_at")
    if error is not None:
        run.error = error
        fields.append("error")
    if worker_name is not None:
        run.worker_name = worker_name
        fields.append("worker_name")
    if run_dir is not None:
        run.run_dir = run_dir
        fields.append("run_dir")
    run.save(update_fields=fields)
    transaction.on_commit(lambda: _broadcast_status(run))
    return run


def claim_run(run_id: int, worker_name: str) -> Run | None:
    """A worker takes a queued run (→ `starting`); None if it is no longer queued (cancelled
    before it started, or a redelivered message of a run that already ran or was lost)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != RunStatus.QUEUED:
            return None
        return transition_run(
            run_id, RunStatus.STARTING, worker_name=worker_name, run_dir=str(settings.INFLIGHT_RUNS_DIR / str(run_id))
        )


def finish_run(run_id: int, status: str, error: str = "") -> Run:
    """Record how a supervised run ended. A run already `lost` (its worker was presumed dead)
    stays lost; a run that ended `cancelled` passes through `cancelling` if nobody else set it."""
    run = Run.objects.get(pk=run_id)
    if run.is_terminal:
        logger.warning("run %s ended %s but is already %s; keeping %s", run_id, status, run.status, run.status)
        return run
    if status == RunStatus.CANCELLED and run.status != RunStatus.CANCELLING:
        transition_run(run_id, RunStatus.CANCELLING)
    return transition_run(run_id, status, error=error)


def can_manage_run(user: AbstractBaseUser, run: Run) -> bool:
    return bool(user.is_authenticated and (user.is_staff or run.owner_id == user.pk))


@transaction.atomic
def request_cancel(run: Run, by_user: AbstractBaseUser) -> Run:
    """Queued runs are cancelled at once; started ones go to `cancelling` and the worker stops them."""
    if not can_manage_run(by_user, run):
        raise PermissionDenied("only the run's owner or staff may cancel it")
    locked = Run.objects.select_for_update().get(pk=run.pk)
    if locked.status == RunStatus.CANCELLING:
        return locked
    if locked.is_terminal:
        raise IllegalTransition(f"run {run.pk} already ended ({locked.status})")
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    target = RunStatus.CANCELLED if locked.status == RunStatus.QUEUED else RunStatus.CANCELLING
    return transition_run(run.pk, target)


# ---------------------------------------------------------------- metrics


# `%(x)b`: the arrays travel in binary over a server-side bound statement (Django's own
# cursors inline parameters as text literals, which PostgreSQL then parses: ~25% slower here).
_INSERT_POINTS_RETURNING_SQL = f"""
INSERT INTO {MetricPoint._meta.db_table} (run_id, seq, line, name, step, t, value)
SELECT %(run)s, %(seq)s, * FROM unnest(
    %(lines)b::bigint[], %(names)b::varchar[], %(steps)b::bigint[], %(ts)b::float8[], %(values)b::float8[]
)
ON CONFLICT (run_id, line, name) DO NOTHING
RETURNING name, step, t, value
"""


def _dedupe(points: Sequence[PointIn]) -> list[PointIn]:
    """Finite points, the first of each (line, name) — a key repeated inside one statement
    would be a conflict PostgreSQL cannot settle (nor should a batch carry one)."""
    seen: set[tuple[int, str]] = set()
    clean = []
    for point in points:
        key = (point.line, point.name[:120])
        if key in seen or not (math.isfinite(point.value) and math.isfinite(point.t)):
            continue
        seen.add(key)
        clean.append(point)
    return clean


def ingest_metrics(run_id: int, points: Sequence[PointIn]) -> int | None:
    """Store a batch, skipping points already stored (same line + name), and fold it into
    the run's downsampled snapshot in the same transaction (`live.folding`), so a page view
    never pays for folding.

    Returns the run's new `metrics_seq`, or None when every point was a duplicate (then the
    sequence is not bumped and nothing is broadcast). Non-finite values are dropped.
    """
    clean = _dedupe(points)
    if not clean:
        return None
    with transaction.atomic():
        connection.ensure_connection()
        with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
            # Locks the run row, so concurrent batches of one run get distinct, ordered seqs.
            cursor.execute(
                f"UPDATE {Run._meta.db_table} SET metrics_seq = metrics_seq + 1 WHERE id = %(run)s RETURNING metrics_seq",
                {"run": run_id},
            )
            row = cursor.fetchone()
            if row is None:
                raise Run.DoesNotExist(f"run {run_id} does not exist")
            seq = int(row[0])
            names = [p.name[:120] for p in clean]
            params = {
                "run": run_id, "seq": seq, "lines": [p.line for p in clean], "names": names,
                "steps": [p.step for p in clean], "ts": [p.t for p in clean], "values": [p.value for p in clean],
            }
            batch_max_step = max(params["steps"])
            inserted = fold_ingest_batch(cursor, run_id, seq, batch_max_step, _INSERT_POINTS_RETURNING_SQL, params)
            if inserted == len(clean):
                stored = [[name, p.step, p.t, p.value] for name, p in zip(names, clean)]  # the common case: all new
            elif inserted > 0:
                # Part of the batch was stored before (a re-send overlapping new lines): push only the new part.
                cursor.execute(
                    f"SELECT name, step, t, value FROM {MetricPoint._meta.db_table} WHERE run_id = %(run)s AND seq = %(seq)s ORDER BY line, name",
                    {"run": run_id, "seq": seq},
                )
                stored = [list(row) for row in cursor.fetchall()]
            else:
                stored = []
        if not stored:
            transaction.set_rollback(True)
            return None
        message = {"type": "metrics.batch", "seq": seq, "points": stored}
        transaction.on_commit(lambda: _group_send(run_group(run_id), message))
    return seq


def points_from_metrics_record(line: int, record: dict[str, Any]) -> list[PointIn]:
    """Split one metrics.jsonl object `{"t", "step", "<metric>": value, ...}` into points."""
    t = float(record.get("t", time.time()))
    step = int(record.get("step", 0))
    points = []
    for key, value in record.items():
        if key in ("t", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        points.append(PointIn(line=line, name=key, step=step, t=t, value=float(value)))
    return points


# ---------------------------------------------------------------- evaluations


_EVAL_FIELDS = ("benchmark", "step", "k", "mean_at_k", "pass_at_k", "num_problems", "num_samples")


@transaction.atomic
def ingest_eval(run_id: int, eval_line: dict[str, Any], per_problem_rows: Iterable[dict[str, Any]]) -> EvalScore:
    """Store one evals.jsonl line and its per-problem rows; re-sending it updates, never duplicates."""
    missing = [name for name in _EVAL_FIELDS if name not in eval_line]
    if missing:
        raise ValueError(f"eval line is missing {', '.join(missing)}")
    score, _ = EvalScore.objects.update_or_create(
        run_id=run_id,
        benchmark=str(eval_line["benchmark"]),
        step=int(eval_line["step"]),
        defaults={
            "k": int(eval_line["k"]),
            "mean_at_k": float(eval_line["mean_at_k"]),
            "pass_at_k": float(eval_line["pass_at_k"]),
            "stderr": None if eval_line.get("stderr") is None else float(eval_line["stderr"]),
            "num_problems": int(eval_line["num_problems"]),
            "num_samples": int(eval_line["num_samples"]),
            "policy_versions": list(eval_line.get("policy_versions") or []),
            "t": float(eval_line.get("t", time.time())),
            "results_file": str(eval_line.get("results_file") or ""),
        },
    )
    rows = [
        EvalProblemResult(
            eval=score,
            problem_id=str(row["problem_id"]),
            answer=str(row.get("answer", "")),
            samples=list(row.get("samples") or []),
            extracted=list(row.get("extracted") or []),
            verdicts=[bool(v) for v in row.get("verdicts") or []],
            mean=float(row.get("mean", 0.0)),
            passed=bool(row.get("pass", False)),
        )
        for row in per_problem_rows
    ]
    if rows:
        EvalProblemResult.objects.bulk_create(rows, ignore_conflicts=True)
    message = {"type": "eval.score", "run_id": run_id, "benchmark": score.benchmark, "step": score.step, "mean_at_k": score.mean_at_k, "pass_at_k": score.pass_at_k, "k": score.k}
    transaction.on_commit(lambda: _group_send(run_group(run_id), message))
    return score


# ---------------------------------------------------------------- workers


def record_heartbeat(
    name: str, *, hostname: str, queues: list[str], gpus: list[dict[str, Any]], cpu_count: int, pid: int | None = None
) -> Worker:
    now = timezone.now()
    worker, created = Worker.objects.update_or_create(
        name=name,
        defaults={"hostname": hostname, "queues": queues, "gpus": gpus, "cpu_count": cpu_count, "pid": pid, "last_heartbeat": now},
        create_defaults={
            "hostname": hostname, "queues": queues, "gpus": gpus, "cpu_count": cpu_count, "pid": pid,
            "last_heartbeat": now, "started_at": now,
        },
    )
    return worker


def mark_lost_runs(lost_after_s: float | None = None) -> list[int]:
    """Runs held by a worker whose heartbeat is older than `lost_after_s` (or that never beat) → `lost`."""
    lost_after_s = settings.INFLIGHT_WORKER_LOST_AFTER_S if lost_after_s is None else lost_after_s
    cutoff = timezone.now() - timedelta(seconds=lost_after_s)
    alive = set(Worker.objects.filter(last_heartbeat__gte=cutoff).values_list("name", flat=True))
    known = set(Worker.objects.values_list("name", flat=True))
    lost = []
    for run in Run.objects.filter(status__in=[RunStatus.STARTING, RunStatus.RUNNING, RunStatus.CANCELLING]):
        if not run.worker_name or run.worker_name in alive:
            continue
        # A worker may claim a run a moment before its first heartbeat is written: a worker
        # never seen gets the same grace period, counted from when it took the run.
        if run.worker_name not in known and run.started_at and run.started_at >= cutoff:
            continue
        try:
            transition_run(run.pk, RunStatus.LOST, error=f"worker {run.worker_name} stopped sending heartbeats")
            lost.append(run.pk)
        except IllegalTransition:
            continue  # it ended between the query and the lock
    return lost
