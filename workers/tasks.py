"""Celery tasks: thin — they only call the platform's services and the supervisor."""

from __future__ import annotations

import logging
import shlex
import sys
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable

import yaml
from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from inflight.alerts import services as alert_services
from inflight.live import ingest
from inflight.provenance.services import ingest_provenance
from inflight.runs import evaluations, run_paths, services
from inflight.runs.models import Run, RunStatus
from rl_core.rundir.layout import CHECKPOINTS_DIR, METRICS_FILE
from workers.supervisor import Outcome, RunSupervisor

logger = logging.getLogger(__name__)


class SupervisedRunStatuses:
    """The statuses of every run this process supervises, read in one query at most every
    `max_age_s`: each run's supervisor asks about its cancel flag every second, and at 200 live
    runs that was 200 queries a second, the most frequent statement of ingest
    (bench/platform_scale.py). A run is asked about from the moment its reporter exists."""

    def __init__(self, max_age_s: float = 1.0) -> None:
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._reporters: weakref.WeakSet[PlatformReporter] = weakref.WeakSet()
        self._statuses: dict[int, str | None] = {}
        self._read_at = float("-inf")

    def register(self, reporter: PlatformReporter) -> None:
        with self._lock:
            self._reporters.add(reporter)

    def status_of(self, run_id: int) -> str | None:
        """The run's status as read at most `max_age_s` ago; None: the run is gone. Raises when
        the database cannot be read (the caller asks again on its next poll)."""
        with self._lock:
            if time.monotonic() - self._read_at >= self.max_age_s or run_id not in self._statuses:
                ids = {reporter.run_id for reporter in self._reporters} | {run_id}
                found = dict(Run.objects.filter(pk__in=ids).values_list("pk", "status"))
                self._statuses = {pk: found.get(pk) for pk in ids}
                self._read_at = time.monotonic()
            return self._statuses[run_id]


class FutureDelivery:
    """A `workers.supervisor.Delivery` of a write done on a writer thread (`concurrent.futures`)."""

    def __init__(self, future: Future[Any]) -> None:
        self.future = future

    def ready(self) -> bool:
        return self.future.done()

    def settle(self) -> None:
        self.future.result()


class MetricsDelivery:
    """A `workers.supervisor.Delivery` of metrics lines: ready once the writer is done with them;
    settling stores them the transactional way if the writer could not (`PendingMetrics.result`)
    and then runs what follows a stored batch."""

    def __init__(self, reporter: PlatformReporter, records: list[tuple[int, dict[str, Any]]], pending: ingest.PendingMetrics) -> None:
        self.reporter, self.records, self.pending = reporter, records, pending

    def ready(self) -> bool:
        return self.pending.ready()

    def settle(self) -> None:
        self.reporter._call(self.pending.result)
        self.reporter.metrics_stored(self.records)


class EvalDelivery(FutureDelivery):
    """An evaluation being stored by the evaluation writer; settling runs the alert rules on its score."""

    def __init__(self, reporter: PlatformReporter, future: Future[Any]) -> None:
        super().__init__(future)
        self.reporter = reporter

    def settle(self) -> None:
        try:
            score = self.future.result()
        except Exception:
            connection.close()  # a database error: the next try reconnects (as PlatformReporter._call)
            raise
        self.reporter._alerts(alert_services.evaluate_eval, self.reporter.run_id, score)


class PlatformReporter:
    """Supervisor → services. A database error closes the connection so the next try reconnects."""

    statuses = SupervisedRunStatuses()  # one per process: its runs' cancel flags in one query

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.statuses.register(self)
        # Rollout viewer and alerts (their own apps; see inflight.rollouts / inflight.alerts).
        self.last_metrics_at = time.monotonic()
        self.last_step: int | None = None
        self.stalled = False
        self._stall_s: float | None = None
        self.is_running = False
        # Per-run state kept between polls, so a poll with nothing to change costs no database
        # round trip (read on first use; see alert_services.AlertState, RolloutIngestState).
        self._alert_state: Any = None
        self._rollout_state: Any = None
        self._metrics_state = ingest.MetricsIngestState()

    def _call(self, function, *args: Any) -> Any:
        try:
            return function(*args)
        except Exception:
            connection.close()
            raise

    def metrics(self, records: list[tuple[int, dict[str, Any]]]) -> MetricsDelivery:
        """Handed to this process's metrics writer (`live.ingest.submit_metric_lines`): the
        supervisor goes on and settles the delivery on a later poll."""
        skipped: list[tuple[int, str]] = []
        pending = self._call(ingest.submit_metric_lines, self.run_id, records, self._metrics_state, skipped)
        for line_no, reason in skipped:
            logger.error("run %s metrics.jsonl line %d skipped: %s", self.run_id, line_no, reason)
        return MetricsDelivery(self, records, pending)

    def metrics_stored(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        """After the lines are stored: alert rules on them, and the stall clock."""
        self._alerts(self._evaluate_metric_lines, records)
        self.last_metrics_at = time.monotonic()
        self.last_step = max([self.last_step or 0, *(int(r.get("step", 0) or 0) for _, r in records)])
        if self.stalled:
            self.stalled = False
            self._alerts(alert_services.check_stalled, self.run_id, 0.0, self.last_step)

    def _evaluate_metric_lines(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        if self._alert_state is None:
            self._alert_state = alert_services.load_alert_state(self.run_id)
        alert_services.evaluate_metric_lines(self.run_id, records, self._alert_state)

    def _alerts(self, function, *args: Any) -> None:
        """Alert rules run after the data is stored. A database error is raised (the batch is
        retried; evaluation is idempotent per line), any other error only logged: a bug in a
        rule must never hold up the run's metrics."""
        try:
            self._call(function, *args)
        except (OperationalError, InterfaceError):
            raise
        except Exception:  # noqa: BLE001
            logger.exception("run %s: alert evaluation failed", self.run_id)

    def rollouts(self, records: list[tuple[int, dict[str, Any]]], lines_read: int) -> FutureDelivery:
        """Handed to this process's rollout writer (`rollouts.services.submit_rollouts`): the
        supervisor goes on with its metrics and settles this on a later poll."""
        from inflight.rollouts.services import submit_rollouts

        decoder, state = self._rollout_ingest()
        return FutureDelivery(self._call(submit_rollouts, self.run_id, records, decoder, state, False, lines_read))

    def rollout_lines_wanted(self) -> Callable[[int], bool] | None:
        # Known once the store was read (the first batch): until then every line is parsed.
        return None if self._rollout_state is None else self._rollout_state.lines_wanted()

    def discarded_rollouts(self, records: list[tuple[int, dict[str, Any]]]) -> FutureDelivery:
        """The same store, grid and state as the stream's samples (one bound on what a run keeps),
        so the same writer: the state is only ever touched by one batch at a time."""
        from inflight.rollouts.services import submit_rollouts

        decoder, state = self._rollout_ingest()
        return FutureDelivery(self._call(submit_rollouts, self.run_id, records, decoder, state, True))

    def _rollout_ingest(self) -> tuple[Any, Any]:
        """(the run's token decoder, its RolloutIngestState), read once."""
        from inflight.rollouts.services import RolloutIngestState
        from inflight.rollouts.tokens import decoder_for_model

        config = self._config() or {}
        if self._rollout_state is None:
            self._rollout_state = RolloutIngestState.from_config(config)
        return decoder_for_model(str((config.get("model") or {}).get("path") or "")), self._rollout_state

    def train_logprobs(self, records: list[dict[str, Any]]) -> None:
        from inflight.rollouts.services import attach_train_logprobs

        self._call(attach_train_logprobs, self.run_id, records)

    def _config(self) -> dict[str, Any]:
        if not hasattr(self, "_run_config"):
            self._run_config = self._call(lambda: Run.objects.filter(pk=self.run_id).values_list("config", flat=True).first()) or {}
        return self._run_config

    def tick(self) -> None:
        """`stalled`: no metrics for `monitoring.alerts.stall_s` while running (checked locally;
        the database is asked only when the alert starts)."""
        if self.stalled or not self.is_running:
            return
        if self._stall_s is None:
            self._stall_s = float(((self._config().get("monitoring") or {}).get("alerts") or {}).get("stall_s", 120.0))
        idle = time.monotonic() - self.last_metrics_at
        if idle >= self._stall_s:
            fired = self._call(alert_services.check_stalled, self.run_id, idle, self.last_step)
            # Not running yet (still starting): keep the clock, ask again later.
            self.stalled = bool(fired) or self._is_stalled_episode_open()

    def _is_stalled_episode_open(self) -> bool:
        from inflight.alerts.models import AlertEpisode

        return self._call(lambda: AlertEpisode.objects.filter(run_id=self.run_id, rule="stalled", active=True).exists())

    def resumed(self, point: Any) -> None:
        """The engine resumed from checkpoint `point.step`: drop what the dead attempt logged
        after it (rl_core.rundir.resume.ResumePoint), so every step is charted once."""
        from inflight.runs.actions import supersede_rewound_history

        self._call(supersede_rewound_history, self.run_id, point.step, point.lines.get(METRICS_FILE, 0), point.t)

    def evaluation(self, line_no: int, record: dict[str, Any], problem_rows: list[dict[str, Any]]) -> EvalDelivery:
        """Handed to this process's evaluation writer (`runs.evaluations.submit_eval`): the
        supervisor goes on and settles it on a later poll (then the alert rules run on the score)."""
        return EvalDelivery(self, self._call(evaluations.submit_eval, self.run_id, record, problem_rows))

    def checkpoints_changed(self) -> None:
        """The run's checkpoints/ folder changed (a checkpoint saved or pruned): its open pages
        fetch their actions panel again (they no longer poll it every few seconds)."""
        self._call(services.announce_run_panel_changed, self.run_id)

    def waiting(self, detail: str) -> None:
        self._call(services.set_status_detail, self.run_id, detail)

    def running(self, pid: int) -> None:
        self.last_metrics_at = time.monotonic()  # the stall clock starts when the run does
        self.is_running = True
        run = self._call(lambda: Run.objects.get(pk=self.run_id))
        if run.status == RunStatus.STARTING:
            self._call(services.transition_run, self.run_id, RunStatus.RUNNING)
        try:  # what ran it (rl_core/launch/provenance.py wrote it before the run's children started)
            self._call(ingest_provenance, self.run_id, run_paths.run_dir(self.run_id))
        except Exception:  # noqa: BLE001 - the run page says "not recorded"; the run goes on
            logger.exception("run %s: its provenance was not stored", self.run_id)

    def cancel_requested(self) -> bool:
        status = self._call(self.statuses.status_of, self.run_id)
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
    resume = run.resume_count > 0
    run_dir = run_paths.run_dir(run.pk)
    if resume and not (run_dir / CHECKPOINTS_DIR).is_dir():
        # Forks and resumes read checkpoints from the run storage every worker shares
        # (INFLIGHT_RUNS_DIR; a volume in docker-compose.yml). Say so rather than start over.
        error = f"cannot resume: {run_dir}/{CHECKPOINTS_DIR} is not on worker {worker_name}; resuming needs the run storage (INFLIGHT_RUNS_DIR) shared by all workers"
        _until_recorded(lambda: services.finish_run(run_id, RunStatus.FAILED, error))
        return RunStatus.FAILED
    supervisor = RunSupervisor(
        run_dir=run_dir,
        resume=resume,
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
    _until_recorded(lambda: services.finish_run(run_id, outcome.status, outcome.error, outcome.ended_reason, outcome.ended_detail))
    _summarise_ended_run(run_id)
    return outcome.status


def _summarise_ended_run(run_id: int) -> None:
    """Bring the ended run's leaderboard summary up to date now (runs/summaries.py), so no
    leaderboard read pays for it later. Best effort: a read would compute it anyway."""
    from inflight.runs.summaries import refresh_summaries

    try:
        refresh_summaries(Run.objects.filter(pk=run_id))
    except Exception:  # the run's end is recorded; its summary can wait for a read
        logger.exception("run %s: its leaderboard summary was not refreshed", run_id)


@shared_task(name="inflight.delete_run_dir", acks_late=True, ignore_result=True)
def delete_run_dir(run_id: int) -> str:
    """Remove the directory of a run whose rows were deleted (`runs.actions.delete_run`)."""
    import shutil

    if Run.objects.filter(pk=run_id).exists():
        return "kept"  # the rows are still there (a stale message): never remove a live run's files
    run_dir = run_paths.run_dir(run_id)
    if run_dir.is_symlink() or not run_dir.is_dir():
        return "absent"
    shutil.rmtree(run_dir)
    logger.info("run %s deleted: removed %s", run_id, run_dir)
    return "removed"


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
