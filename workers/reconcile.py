"""A restarted worker settles the runs an earlier process under its name left behind.

When a worker process dies (SIGKILL, OOM, a crash), its runs' engines stop with it
(PR_SET_PDEATHSIG), but the database still says `starting`, `running` or `cancelling`, and the
last metric lines it had not delivered are only in the run directory. The next process started
under the same worker name (same node, same run directories) reads each such run's directory:
it delivers every metric and eval line not stored yet (ingest is idempotent per line), stops an
engine that is somehow still alive, and records the final state:

- `status.json` says `succeeded` or `failed` → that (the engine finished on its own);
- a cancel was requested → `cancelled`;
- otherwise → `lost` (the engine was stopped because its worker died), with the reason.

A run the lost-run sweep already marked `lost` is settled the same way (lost → its real end).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from inflight.runs import run_paths, services
from inflight.runs.models import ACTIVE_STATUSES, ALLOWED_TRANSITIONS, Run, RunStatus
from rl_core.rundir.layout import FINAL_STATES, read_status
from rl_core.common.processes import stop_process_groups
from rl_core.rundir.resume import read_resumes
from workers.supervisor import RunSupervisor

logger = logging.getLogger(__name__)


def _engine_alive(pid: int, run_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return state != "Z" and str(run_dir) in cmdline


@dataclass(frozen=True)
class _OrphanEngine:
    """A dead worker's engine (a process group leader this worker did not start): running while
    its pid is alive and still names the run directory (the pid may have been reused)."""

    pid: int
    run_dir: Path

    def poll(self) -> int | None:
        return None if _engine_alive(self.pid, self.run_dir) else 0


def _stop_engine(pid: int, run_dir: Path) -> None:
    if not _engine_alive(pid, run_dir):
        return
    logger.warning("run dir %s: engine pid %d outlived its worker; stopping it", run_dir, pid)
    if stop_process_groups([_OrphanEngine(pid, run_dir)], settings.INFLIGHT_CANCEL_TIMEOUT_S, kill_wait_s=5.0, poll_s=0.2):
        logger.warning("run dir %s: engine pid %d still alive %.0fs after SIGTERM; SIGKILL", run_dir, pid, settings.INFLIGHT_CANCEL_TIMEOUT_S)


def reconcile_run(run: Run, timeout_s: float = 60.0) -> str:
    """Deliver what `run`'s directory holds and record its final state; returns that state."""
    from workers.tasks import PlatformReporter

    # The directory the worker recorded (the engine's `--out`, which _engine_alive matches).
    run_dir = Path(run.run_dir) if run.run_dir else run_paths.run_dir(run.pk)
    status = read_status(run_dir)
    if status and status.pid is not None and status.state not in FINAL_STATES:
        _stop_engine(status.pid, run_dir)
        status = read_status(run_dir)
    supervisor = RunSupervisor(run_dir=run_dir, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=settings.REPO_ROOT)
    # A resumed run's rewound lines stay superseded here too (rl_core/rundir/resume.py).
    supervisor.resumes = read_resumes(run_dir)
    deadline = time.monotonic() + timeout_s
    while not supervisor.deliver():
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run.pk}: could not deliver its run directory's lines")
        time.sleep(1.0)
    state = status.state if status else None
    run.refresh_from_db()
    cancel_wanted = run.cancel_requested_at is not None or run.status == RunStatus.CANCELLING
    if state in ("succeeded", "failed"):
        final, error = state, ((status.error if status else None) or "") if state == "failed" else ""
    elif cancel_wanted:
        final, error = RunStatus.CANCELLED, ""
    else:
        final = RunStatus.LOST
        error = f"worker {run.worker_name} died while the run was {state or 'starting'}; the engine stopped with it"
    for _ in range(3):
        run.refresh_from_db()
        if run.status == final or (run.is_terminal and final not in ALLOWED_TRANSITIONS[run.status]):
            break
        try:
            if final == RunStatus.CANCELLED and run.status in (RunStatus.STARTING, RunStatus.RUNNING):
                services.transition_run(run.pk, RunStatus.CANCELLING)
            # The engine's own account of why it ended, when the end recorded is the one it wrote.
            ended = (status.ended_reason or "") if status is not None and state == final else ""
            services.transition_run(run.pk, final, error=error, ended_reason=ended,
                                    ended_detail=(status.ended_detail or "") if status is not None and ended else "")
            break
        except services.IllegalTransition:
            continue  # someone else moved it meanwhile (the sweep, a cancel): decide again
    Run.objects.filter(pk=run.pk).update(reconciled_at=timezone.now())
    run.refresh_from_db()
    logger.warning("run %s of an earlier process of this worker reconciled from %s: %s", run.pk, run_dir, run.status)
    return run.status


def reconcile_previous_incarnations(worker_name: str, incarnation: str) -> list[int]:
    """Settle every run an earlier process named `worker_name` left unsettled."""
    runs = (
        Run.objects.filter(worker_name=worker_name, reconciled_at__isnull=True)
        .exclude(worker_incarnation=incarnation)
        .filter(Q(status__in=list(ACTIVE_STATUSES)) | Q(status=RunStatus.LOST))
    )
    done = []
    for run in runs:
        reconcile_run(run)
        done.append(run.pk)
    return done
