"""Celery tasks: thin — they only call the platform's services and the supervisor."""

from __future__ import annotations

import logging
import shlex
import sys
import time
from typing import Any

import yaml
from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from inflight.runs import services
from inflight.runs.models import Run, RunStatus
from workers.supervisor import Outcome, RunSupervisor

logger = logging.getLogger(__name__)


class PlatformReporter:
    """Supervisor → services. A database error closes the connection so the next try reconnects."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

    def _call(self, function, *args: Any) -> Any:
        try:
            return function(*args)
        except Exception:
            connection.close()
            raise

    def metrics(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        points = []
        for line_no, record in records:
            try:
                points.extend(services.points_from_metrics_record(line_no, record))
            except (TypeError, ValueError) as exc:
                logger.error("run %s metrics.jsonl line %d skipped: %s", self.run_id, line_no, exc)
        if points:
            self._call(services.ingest_metrics, self.run_id, points)

    def evaluation(self, line_no: int, record: dict[str, Any], problem_rows: list[dict[str, Any]]) -> None:
        self._call(services.ingest_eval, self.run_id, record, problem_rows)

    def running(self, pid: int) -> None:
        run = self._call(lambda: Run.objects.get(pk=self.run_id))
        if run.status == RunStatus.STARTING:
            self._call(services.transition_run, self.run_id, RunStatus.RUNNING)

    def cancel_requested(self) -> bool:
        status = self._call(lambda: Run.objects.filter(pk=self.run_id).values_list("status", flat=True).first())
        # A run gone from the database, or marked lost by another node, must not keep running here.
        return status in (None, RunStatus.CANCELLING, RunStatus.CANCELLED, RunStatus.LOST)


def rl_command_prefix() -> list[str]:
    python = settings.INFLIGHT_RL_PYTHON or sys.executable
    return shlex.split(settings.INFLIGHT_RL_COMMAND) if settings.INFLIGHT_RL_COMMAND else [python, "-m", "rl_core"]


@shared_task(bind=True, name=services.EXECUTE_RUN_TASK, acks_late=True, ignore_result=True)
def execute_run(self, run_id: int) -> str:
    worker_name = self.request.hostname or "unknown-worker"
    from workers.celery_app import INCARNATION

    run = services.claim_run(run_id, worker_name, INCARNATION)
    if run is None:
        return "skipped"
    # Checked again here, before the engine opens anything: the paths must still be within what
    # the platform allows its owner (resolved on this machine, symlinks and all).
    try:
        config = services.check_run_for_owner(run.owner, services.validate_run_config(run.config), on_worker=True)
    except services.InvalidRunConfig as exc:
        logger.warning("run %s refused on the worker: %s", run_id, exc)
        _until_recorded(lambda: services.finish_run(run_id, RunStatus.FAILED, f"refused by the worker: {exc}"))
        return RunStatus.FAILED
    supervisor = RunSupervisor(
        run_dir=settings.INFLIGHT_RUNS_DIR / str(run.pk),
        config_yaml=yaml.safe_dump(config, sort_keys=False),
        command_prefix=rl_command_prefix(),
        reporter=PlatformReporter(run.pk),
        cwd=settings.REPO_ROOT,
        poll_s=settings.INFLIGHT_POLL_S,
        term_timeout_s=settings.INFLIGHT_CANCEL_TIMEOUT_S,
    )
    try:
        supervisor.start()
        outcome = supervisor.supervise()
    except Exception as exc:  # noqa: BLE001 - the run must end in a recorded state, never hang in `running`
        logger.exception("run %s: supervision failed", run_id)
        supervisor.signal_group(9)
        outcome = Outcome("failed", f"worker error: {exc}")
    _until_recorded(lambda: services.finish_run(run_id, outcome.status, outcome.error))
    return outcome.status


def _until_recorded(write, timeout_s: float = 300.0) -> None:
    """Retry a final write while the database is away (a run must not stay `running` forever)."""
    deadline = time.monotonic() + timeout_s
    warned = False
    while True:
        try:
            write()
            if warned:
                logger.warning("database back; final status written")
            return
        except (OperationalError, InterfaceError) as exc:
            connection.close()
            if time.monotonic() > deadline:
                raise
            if not warned:  # one line per outage, not a traceback every 2 s
                logger.warning("database unavailable (%s); retrying the final status write quietly", type(exc).__name__)
                warned = True
            time.sleep(2.0)
