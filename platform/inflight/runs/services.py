"""Every write to runs and what they report (HackSoftware style: views and tasks only call these).

Live updates go to Channels groups after the transaction commits (`live.broadcast`; a run's
metrics and their `metrics.batch` pushes are `live.ingest`'s):
- `run-<id>`: `{"type": "run.status", "run_id", "status", "error"}` and `{"type": "run.panel", "run_id"}`;
- `runs-user-<owner id>`: `{"type": "run.status", "run_id", "status", "error"}`.
A broadcast that fails (Redis away) is logged and dropped: the database already holds the
data and clients re-sync from a snapshot, so nothing recorded is lost.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any, Iterable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from inflight.live.broadcast import push, push_on_commit, run_group, user_runs_group
from inflight.runs import run_limits, run_paths
from inflight.runs.models import (
    ALLOWED_TRANSITIONS,
    TERMINAL_STATUSES,
    Run,
    RunStatus,
    Worker,
)
from inflight.runs.safe_input import value_errors
from inflight.runs.selectors import can_manage_run
from inflight.task_queue import EXECUTE_RUN_TASK, app
from rl_core.config.run_config import RunConfig
from rl_core.config.files import field_errors, with_run_defaults
from rl_core.rundir.layout import ended_sentence

logger = logging.getLogger(__name__)


class IllegalTransition(Exception):
    """A status change the run state machine forbids (e.g. succeeded → running)."""


class InvalidRunConfig(ValueError):
    """A run config refused by RunConfig; `errors` maps dotted field paths to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{field}: {', '.join(messages)}" for field, messages in errors.items()))


def validate_run_config(config_dict: Any) -> RunConfig:
    """RunConfig of an untrusted dict; InvalidRunConfig naming the fields otherwise. Refused
    before pydantic sees them: NUL characters, non-finite or out-of-range numbers, deep nesting;
    and after it: a float field that became non-finite by coercion (the text '1e999')."""
    if not isinstance(config_dict, dict):
        raise InvalidRunConfig({"config": ["must be a mapping of config sections"]})
    # The run defaults (rl_core.config.files.RUN_DEFAULTS) where the config is silent: every way of
    # submitting (form, YAML tab, API, CLI) goes through here, so all get the same run.
    config_dict = with_run_defaults(config_dict)
    errors = value_errors(config_dict)
    if errors:
        raise InvalidRunConfig(errors)
    try:
        config = RunConfig.model_validate(config_dict)
    except ValidationError as exc:
        raise InvalidRunConfig(field_errors(exc)) from exc
    errors = value_errors(config.model_dump(mode="python"))
    if errors:
        raise InvalidRunConfig(errors)
    return config


class RunLimitExceeded(InvalidRunConfig):
    """The submitter already has as many active runs as the platform allows."""


def check_run_for_owner(owner: AbstractBaseUser, config: RunConfig, *, on_worker: bool = False) -> dict[str, Any]:
    """The config as the worker should run it (resolved paths, filled-in limits), or
    InvalidRunConfig naming the fields that reach outside what the platform allows."""
    path_problems, resolved = run_paths.checked_paths(owner, config, on_worker=on_worker)
    limit_problems, filled = run_limits.limit_errors(owner, config) if not on_worker else ({}, {})
    problems = {**limit_problems, **path_problems}
    if problems:
        raise InvalidRunConfig(problems)
    data = config.model_dump(mode="json")
    data.update(filled)
    return run_paths.apply_resolved(data, resolved) if on_worker else data


@transaction.atomic
def create_run(owner: AbstractBaseUser, name: str, config_dict: dict[str, Any]) -> Run:
    """Validate through RunConfig and the platform's rules (paths, limits), store the resolved
    config, queue it on `cpu` or `gpu` after commit."""
    name = (name or "").strip() or str(config_dict.get("name", "") if isinstance(config_dict, dict) else "")
    if isinstance(config_dict, dict) and name:
        config_dict = {**config_dict, "name": name}
    config = validate_run_config(config_dict)
    stored = check_run_for_owner(owner, config)
    # The owner's row is locked so that two submissions at once cannot both pass the count.
    get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
    refusal = run_limits.active_runs_error(owner)
    if refusal:
        raise RunLimitExceeded({"config": [refusal]})
    run = Run.objects.create(
        owner=owner,
        name=config.name,
        config=stored,
        queue=run_limits.run_queue(config),
        status=RunStatus.QUEUED,
    )
    run.run_dir = str(run_paths.run_dir(run.pk))
    run.save(update_fields=["run_dir"])
    transaction.on_commit(lambda: dispatch_run(run.pk, run.queue))
    transaction.on_commit(lambda: _broadcast_status(run))
    return run


def dispatch_run(run_id: int, queue: str) -> None:
    # Sent through the project's Celery app (`inflight.task_queue`, configured from Django
    # settings), never Celery's default app, which a web process would otherwise use.
    try:
        app.send_task(EXECUTE_RUN_TASK, args=[run_id], queue=queue, retry=False)
    except Exception as exc:  # noqa: BLE001 - the broker is away: say so on the run instead of hiding it
        logger.error("could not queue run %s on %s", run_id, queue, exc_info=True)
        transition_run(run_id, RunStatus.FAILED, error=f"could not queue the run on '{queue}': {exc}")


def _queued_run_ids_in_broker(queues: Iterable[str]) -> set[int] | None:
    """Run ids whose message waits in a queue or is held unacknowledged by a worker, read from
    the Redis broker; None when the broker is not Redis (then nothing is re-sent)."""
    import base64
    import json

    with app.connection_for_write() as conn:
        if conn.transport_cls not in ("redis", "rediss") and not str(conn.transport_cls).startswith("redis"):
            return None
        client = conn.default_channel.client
        raw = []
        for queue in queues:
            raw.extend(client.lrange(queue, 0, -1))
        for value in client.hvals("unacked"):
            try:
                raw.append(json.dumps(json.loads(value)[0]))
            except (ValueError, IndexError, TypeError):
                continue
    ids = set()
    for message in raw:
        try:
            envelope = json.loads(message)
            if envelope.get("headers", {}).get("task") != EXECUTE_RUN_TASK:
                continue
            body = json.loads(base64.b64decode(envelope["body"])) if envelope.get("properties", {}).get("body_encoding") == "base64" else json.loads(envelope["body"])
            ids.add(int(body[0][0]))
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    return ids


_requeue_checked_at = 0.0


def requeue_lost_messages(older_than_s: float | None = None) -> list[int]:
    """Re-send runs `queued` for longer than `older_than_s` whose message is neither waiting in
    the broker nor held by a worker (a broker restart without its data loses them). A duplicate
    delivery is harmless: `claim_run` lets only one run it. At most once per `older_than_s`."""
    global _requeue_checked_at
    older_than_s = settings.INFLIGHT_REQUEUE_AFTER_S if older_than_s is None else older_than_s
    if time.monotonic() - _requeue_checked_at < older_than_s:
        return []
    _requeue_checked_at = time.monotonic()
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    waiting = list(Run.objects.filter(status=RunStatus.QUEUED, created_at__lt=cutoff).values_list("pk", "queue"))
    if not waiting:
        return []
    present = _queued_run_ids_in_broker(sorted({queue for _, queue in waiting}))
    if present is None:
        return []
    resent = []
    for run_id, queue in waiting:
        if run_id not in present:
            logger.warning("run %s is queued but its message is not in the broker; sending it again", run_id)
            dispatch_run(run_id, queue)
            resent.append(run_id)
    return resent


# ---------------------------------------------------------------- status


def _broadcast_status(run: Run) -> None:
    message = {"type": "run.status", "run_id": run.pk, "status": run.status, "error": run.error, "detail": run.status_note}
    push(run_group(run.pk), message)
    push(user_runs_group(run.owner_id), message)


def announce_run_panel_changed(run_id: int) -> None:
    """The run page's actions panel (checkpoints, children, tags, note, archive) changed: its open
    pages fetch panel.json again, instead of polling it. Sent after the commit inside a transaction
    (the page must read the change), at once outside one."""
    message = {"type": "run.panel", "run_id": run_id}
    push_on_commit(run_group(run_id), message)


@transaction.atomic
def transition_run(
    run_id: int,
    new_status: str,
    *,
    error: str | None = None,
    worker_name: str | None = None,
    run_dir: str | None = None,
    ended_reason: str = "",
    ended_detail: str = "",
) -> Run:
    """Move a run to `new_status`; raises IllegalTransition if the state machine forbids it.
    An end records why (`ended_reason`, run_dir.ENDED_REASONS; by default what the status says:
    cancelled, failed, lost, or a succeeded run's steps done); a restart (queued) forgets it."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if new_status not in RunStatus.values:
        raise IllegalTransition(f"unknown status {new_status!r}")
    if new_status not in ALLOWED_TRANSITIONS[run.status]:
        raise IllegalTransition(f"run {run_id}: {run.status} → {new_status} is not allowed")
    now = timezone.now()
    run.status = new_status
    fields = ["status"]
    if run.status_detail and new_status != RunStatus.STARTING:
        run.status_detail = ""  # what a starting run waited for is over
        fields.append("status_detail")
    if new_status == RunStatus.STARTING and run.started_at is None:
        run.started_at = now
        fields.append("started_at")
    if new_status in TERMINAL_STATUSES:
        run.finished_at = now
        run.ended_reason = ended_reason or {RunStatus.SUCCEEDED: "max_steps"}.get(new_status, str(new_status))
        run.ended_detail = (ended_detail or ended_sentence(run.ended_reason))[:300]
        fields += ["finished_at", "ended_reason", "ended_detail"]
    elif run.ended_reason:
        run.ended_reason, run.ended_detail = "", ""
        fields += ["ended_reason", "ended_detail"]
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
    if new_status in TERMINAL_STATUSES:
        # A slot under the owner's active-run limit is free: a sweep's waiting runs take it.
        transaction.on_commit(lambda: _queue_waiting_sweep_runs(run.owner_id))
    return run


def _queue_waiting_sweep_runs(owner_id: int) -> None:
    from inflight.runs.sweeps import queue_waiting  # sweeps builds on this module

    try:
        queue_waiting(owner_id)
    except Exception:  # noqa: BLE001 - the end is recorded; the waiting runs stay in their group for the next end
        logger.error("could not queue the waiting sweep runs of user %s", owner_id, exc_info=True)


def set_status_detail(run_id: int, detail: str) -> None:
    """What a starting run waits for, in the launcher's words (status.json `detail`); "" when
    nothing. Only a run still `starting` takes it: a late report never labels a running run."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, status=RunStatus.STARTING).first()
        if run is None or run.status_detail == detail[:500]:
            return
        run.status_detail = detail[:500]
        run.save(update_fields=["status_detail"])
        transaction.on_commit(lambda: _broadcast_status(run))


def claim_run(run_id: int, worker_name: str, worker_incarnation: str = "") -> Run | None:
    """A worker takes a queued run (→ `starting`); None if it is no longer queued (cancelled
    before it started, or a redelivered message of a run that already ran or was lost).
    `worker_incarnation` names the claiming *process*: a worker restarted under the same name
    is another incarnation and does not vouch for the dead one's runs."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != RunStatus.QUEUED:
            return None
        Run.objects.filter(pk=run_id).update(worker_incarnation=worker_incarnation)
        return transition_run(
            run_id, RunStatus.STARTING, worker_name=worker_name, run_dir=str(run_paths.run_dir(run_id))
        )


@transaction.atomic
def finish_run(run_id: int, status: str, error: str = "", ended_reason: str = "", ended_detail: str = "") -> Run:
    """Record how a supervised run ended. A run already `lost` (its worker was presumed dead)
    stays lost; a run that ended `cancelled` passes through `cancelling` if nobody else set it.

    The row is locked before its status is read, so a sweeper cannot mark the run `lost`
    between the check and the write; an end the state machine still refuses is logged and
    the stored status kept (the worker's final write must not raise)."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.is_terminal:
        logger.warning("run %s ended %s but is already %s; keeping %s", run_id, status, run.status, run.status)
        return run
    try:
        if status == RunStatus.CANCELLED and run.status != RunStatus.CANCELLING:
            transition_run(run_id, RunStatus.CANCELLING)
        return transition_run(run_id, status, error=error, ended_reason=ended_reason, ended_detail=ended_detail)
    except IllegalTransition:
        logger.warning("run %s ended %s, which its status %s does not allow; keeping %s", run_id, status, run.status, run.status)
        return run


@transaction.atomic
def request_cancel(run: Run, by_user: AbstractBaseUser) -> Run:
    """Queued runs are cancelled at once; started ones go to `cancelling` and the worker stops them.
    A run nobody supervises any more ends `cancelled` at once: one already `lost`, or one whose
    worker process stopped sending heartbeats (`cancelling` would otherwise wait forever)."""
    if not can_manage_run(by_user, run):
        raise PermissionDenied("only the run's owner or staff may cancel it")
    locked = Run.objects.select_for_update().get(pk=run.pk)
    if locked.status == RunStatus.LOST:
        Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
        return transition_run(run.pk, RunStatus.CANCELLED)
    if locked.status == RunStatus.CANCELLING:
        if not run_worker_alive(locked):
            return transition_run(run.pk, RunStatus.CANCELLED, error=_orphan_cancel_error(locked))
        return locked
    if locked.is_terminal:
        raise IllegalTransition(f"run {run.pk} already ended ({locked.status})")
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
    target = RunStatus.CANCELLED if locked.status == RunStatus.QUEUED else RunStatus.CANCELLING
    cancelled = transition_run(run.pk, target)
    if target == RunStatus.CANCELLING and not run_worker_alive(locked):
        return transition_run(run.pk, RunStatus.CANCELLED, error=_orphan_cancel_error(locked))
    return cancelled


def _orphan_cancel_error(run: Run) -> str:
    return f"cancelled while its worker {run.worker_name} was not sending heartbeats (the engine stops with its worker)"


# ---------------------------------------------------------------- workers


def record_heartbeat(
    name: str,
    *,
    hostname: str,
    queues: list[str],
    gpus: list[dict[str, Any]],
    cpu_count: int,
    pid: int | None = None,
    incarnation: str = "",
    cluster_nodes: list[dict[str, Any]] | None = None,
    cluster_error: str = "",
) -> Worker:
    now = timezone.now()
    values = {"hostname": hostname, "queues": queues, "gpus": gpus, "cpu_count": cpu_count, "pid": pid, "incarnation": incarnation, "last_heartbeat": now,
              "cluster_nodes": cluster_nodes or [], "cluster_error": cluster_error[:500]}
    existing = Worker.objects.filter(name=name).values_list("incarnation", flat=True).first()
    if existing is not None and existing != incarnation:
        values["started_at"] = now  # another process under the same name: it started now
    worker, created = Worker.objects.update_or_create(name=name, defaults=values, create_defaults={**values, "started_at": now})
    return worker


def _worker_alive(run: Run, workers: dict[str, Worker], cutoff) -> bool | None:
    """True/False: the process that claimed `run` is/is not beating; None: too early to tell."""
    worker = workers.get(run.worker_name)
    same_process = worker is not None and (not run.worker_incarnation or worker.incarnation == run.worker_incarnation)
    if same_process and worker.last_heartbeat >= cutoff:
        return True
    # A worker may claim a run a moment before its first heartbeat (or the first one of this
    # incarnation) is written: the same grace period, counted from when it took the run.
    if not same_process and run.started_at and run.started_at >= cutoff:
        return None
    return False


def run_worker_alive(run: Run, lost_after_s: float | None = None) -> bool:
    """Whether the worker process that claimed `run` still vouches for it (or may still)."""
    lost_after_s = settings.INFLIGHT_WORKER_LOST_AFTER_S if lost_after_s is None else lost_after_s
    if not run.worker_name:
        return True
    cutoff = timezone.now() - timedelta(seconds=lost_after_s)
    return _worker_alive(run, {w.name: w for w in Worker.objects.filter(name=run.worker_name)}, cutoff) is not False


def mark_lost_runs(lost_after_s: float | None = None) -> list[int]:
    """Runs held by a worker process whose heartbeat is older than `lost_after_s` (or that never
    beat, or whose name now beats from another process) → `lost`; a `cancelling` one → `cancelled`.

    Call it only from a process whose own database access has worked for at least
    `lost_after_s` (`inflight.runs.liveness.LostRunSweeper` checks that): right after an outage
    every heartbeat is old, and the others have not had the time to write a new one yet."""
    lost_after_s = settings.INFLIGHT_WORKER_LOST_AFTER_S if lost_after_s is None else lost_after_s
    cutoff = timezone.now() - timedelta(seconds=lost_after_s)
    # Only what `_worker_alive` reads: every web node and worker process sweeps every few seconds,
    # and loading each live run whole (its config decoded) was 8% of a web node's CPU at 200 live
    # runs (bench/platform_scale.py, py-spy --gil).
    workers = {worker.name: worker for worker in Worker.objects.only("name", "incarnation", "last_heartbeat")}
    lost = []
    active = Run.objects.filter(status__in=[RunStatus.STARTING, RunStatus.RUNNING, RunStatus.CANCELLING])
    for run in active.only("id", "status", "worker_name", "worker_incarnation", "started_at"):
        if not run.worker_name or _worker_alive(run, workers, cutoff) is not False:
            continue
        try:
            if run.status == RunStatus.CANCELLING:
                transition_run(run.pk, RunStatus.CANCELLED, error=_orphan_cancel_error(run))
            else:
                transition_run(run.pk, RunStatus.LOST, error=f"worker {run.worker_name} stopped sending heartbeats")
            lost.append(run.pk)
        except IllegalTransition:
            continue  # it ended between the query and the lock
    return lost
