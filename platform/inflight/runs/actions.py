"""What a user does to runs after launching them: clone, fork from a checkpoint, resume,
organise (tags, note, archive) and delete. Views (web and API) call these; the state machine
and queueing stay in `services`.

Run storage: the checkpoints a fork or resume starts from are read where the run wrote them,
`<INFLIGHT_RUNS_DIR>/<run id>/`, a folder shared by the web server and every worker (a volume
in docker-compose.yml). Any worker of the run's queue may therefore pick up a fork or a resume;
a worker that does not see the folder fails the run with a message saying so
(`workers/tasks.py`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from inflight.runs import run_limits, run_paths, services
from inflight.runs.models import TERMINAL_STATUSES, EvalScore, MetricPoint, Run, RunStatus
from inflight.runs.selectors import can_manage_run
from rl_core.common.metric_names import HELDOUT_SUCCESS
from rl_core.rundir.resume import ResumeError, check_checkpoint
from rl_core.rundir.layout import CHECKPOINT_STATE_FILE, LATEST_CHECKPOINT_LINK, checkpoint_step

logger = logging.getLogger(__name__)

MAX_TAGS = 20
TAG_RE = re.compile(r"^[\w.:/+\-]{1,40}$")
MAX_NOTE_CHARS = 10_000
DELETE_RUN_DIR_TASK = "inflight.delete_run_dir"


class ActionRefused(Exception):
    """The action cannot be done in the run's present state (API: 409); the message says why."""


class BadActionInput(ValueError):
    """Malformed input (API: 400); `errors` maps field names to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{key}: {', '.join(messages)}" for key, messages in errors.items()))


# ---------------------------------------------------------------- checkpoints


@dataclass
class CheckpointInfo:
    """One checkpoint of a run as the run page and `GET /api/runs/<id>/checkpoints/` list it."""

    step: int
    t: float | None
    path: str
    evals: dict[str, float] = field(default_factory=dict)  # benchmark → mean@k at this step
    latest: bool = False

    @property
    def saved_at(self) -> Any:
        from datetime import datetime, timezone as tz

        return None if self.t is None else datetime.fromtimestamp(self.t, tz=tz.utc)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "t": self.t, "path": self.path, "evals": self.evals, "latest": self.latest}


def run_checkpoints(run: Run) -> list[CheckpointInfo]:
    """The run's checkpoints on disk, oldest first, with their time (trainer_state.json) and
    the evaluation scores the run logged at that step. The caller has checked visibility."""
    folder = run_paths.checkpoints_folder(run.pk)
    try:
        names = [entry.name for entry in folder.iterdir() if entry.is_dir() and not entry.is_symlink()]
    except OSError:
        return []
    latest = None
    try:
        latest = Path((folder / LATEST_CHECKPOINT_LINK).readlink()).name
    except OSError:
        pass
    steps = sorted(step for name in names if (step := checkpoint_step(name)) is not None)
    scores: dict[int, dict[str, float]] = {}
    for benchmark, step, mean in EvalScore.objects.filter(run=run, step__in=steps).values_list("benchmark", "step", "mean_at_k"):
        scores.setdefault(step, {})[benchmark] = mean
    out = []
    for step in steps:
        path = run_paths.checkpoint_path(run.pk, step)
        t = None
        try:
            t = float(json.loads((path / CHECKPOINT_STATE_FILE).read_text()).get("t"))
        except (OSError, ValueError, TypeError):
            pass
        out.append(CheckpointInfo(step=step, t=t, path=str(path), evals=scores.get(step, {}), latest=path.name == latest))
    # Held-out success is logged as a metric, not an evaluation: show it beside the benchmarks.
    heldout = dict(MetricPoint.objects.filter(run=run, name=HELDOUT_SUCCESS, step__in=steps).order_by("line").values_list("step", "value"))
    for info in out:
        if info.step in heldout:
            info.evals.setdefault("heldout", heldout[info.step])
    return out


# ---------------------------------------------------------------- clone and fork


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override` laid over it, nested sections merged key by key (a config and its edits)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def fork_model_path(source: Run, step: int) -> str:
    """The checkpoint directory of `source` at `step`; BadActionInput listing the steps it has."""
    available = [info.step for info in run_checkpoints(source)]
    if step not in available:
        listed = ", ".join(str(s) for s in available) or "none"
        raise BadActionInput({"from_step": [f"run {source.pk} has no checkpoint at step {step} (it has: {listed})"]})
    return str(run_paths.checkpoint_path(source.pk, step))


def clone_config(source: Run, overrides: Any = None, from_step: int | None = None) -> dict[str, Any]:
    """The source run's config with `overrides` merged in (nested mappings merge, other values
    replace) and, for a fork, the model set to the chosen checkpoint."""
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise BadActionInput({"config": ["must be a mapping of config overrides"]})
    config = deep_merge(source.config or {}, overrides)
    if from_step is not None:
        model = dict(config.get("model") or {})
        model["path"] = fork_model_path(source, from_step)
        model["build_tiny_if_missing"] = False  # a checkpoint is never rebuilt
        config["model"] = model
    return config


def clone_run(user: AbstractBaseUser, source: Run, name: str = "", overrides: Any = None, from_step: int | None = None) -> Run:
    """A new run of `user` from `source`'s config (+ overrides); with `from_step`, a fork whose
    model is `source`'s checkpoint at that step. Validated and queued like any new run
    (services.InvalidRunConfig / RunLimitExceeded otherwise); records its parent."""
    if from_step is not None and (isinstance(from_step, bool) or not isinstance(from_step, int) or from_step < 0):
        raise BadActionInput({"from_step": ["must be a non-negative integer step"]})
    config = clone_config(source, overrides, from_step)
    name = (name or "").strip() or f"{source.name}-{'fork' if from_step is not None else 'clone'}"
    with transaction.atomic():
        # The worker is sent the run after this commits, so it sees the lineage too.
        run = services.create_run(user, name, config)
        record_lineage(run, source, from_step)
    return run


def record_lineage(run: Run, source: Run, parent_step: int | None) -> None:
    """`run` was cloned (`parent_step` None) or forked from `source`: the parent link, and a
    label ('#id name') that still says where the run came from once the parent is deleted."""
    label = f"#{source.pk} {source.name}"[: Run._meta.get_field("parent_label").max_length]
    Run.objects.filter(pk=run.pk).update(parent=source, parent_step=parent_step, parent_label=label)
    run.parent, run.parent_step, run.parent_label = source, parent_step, label
    services.announce_run_panel_changed(source.pk)  # the parent's panel lists the runs made from it


# ---------------------------------------------------------------- resume


def resume_problem(run: Run) -> str | None:
    """Why `run` cannot be resumed now, or None."""
    if run.status not in (RunStatus.FAILED, RunStatus.LOST, RunStatus.CANCELLED):
        return f"only a failed, lost or cancelled run can be resumed; run {run.pk} is {run.status}"
    try:
        check_checkpoint(run_paths.run_dir(run.pk))
    except ResumeError as exc:
        return f"run {run.pk}: {exc}"
    return None


def resume_run(run: Run, by_user: AbstractBaseUser) -> Run:
    """The same run, queued again to continue from its latest checkpoint (the worker starts the
    engine with --resume). ActionRefused naming the checkpoint when it is missing or unreadable:
    a resume never silently starts over."""
    if not can_manage_run(by_user, run):
        raise PermissionDenied("only the run's owner or staff may resume it")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        problem = resume_problem(locked)
        if problem:
            raise ActionRefused(problem)
        refusal = run_limits.active_runs_error(locked.owner)
        if refusal:
            raise services.RunLimitExceeded({"config": [refusal]})
        # Wall time counts running only: the attempt that ended is banked, and the resumed one
        # starts its clock when a worker starts it (transition_run sets started_at again).
        ran_s = (locked.wall_time_s or 0.0) if locked.started_at is not None else locked.earlier_attempts_s
        services.transition_run(locked.pk, RunStatus.QUEUED, error="")
        Run.objects.filter(pk=locked.pk).update(
            resume_count=locked.resume_count + 1, finished_at=None, cancel_requested_at=None,
            worker_incarnation="", reconciled_at=None, earlier_attempts_s=ran_s, started_at=None,
        )
        queue = locked.queue
        transaction.on_commit(lambda: services.dispatch_run(locked.pk, queue))
    return Run.objects.select_related("owner", "parent").get(pk=run.pk)


def supersede_rewound_history(run_id: int, step: int, metrics_lines: int, resumed_t: float) -> int:
    """A resume rewound the run to checkpoint `step`: forget the points logged after it by the
    attempt that died (metrics.jsonl lines below `metrics_lines`) and its evaluations after
    it, so the chart shows each step once. The lines stay in the run directory; the supervisor
    skips them when it re-reads the files (rl_core.rundir.resume.is_superseded). The snapshot is
    folded again, and the batch counter jumps by one so that open pages see a gap and reload.
    Idempotent. Returns how many points went."""
    from inflight.live.folding import fold_pending_batches
    from inflight.live.models import SnapshotBucket, SnapshotCursor
    from inflight.runs.summaries import drop_summary

    with transaction.atomic():
        Run.objects.select_for_update().filter(pk=run_id).first()
        deleted, _ = MetricPoint.objects.filter(run_id=run_id, step__gt=step, line__lt=metrics_lines).delete()
        EvalScore.objects.filter(run_id=run_id, step__gt=step, t__lt=resumed_t).delete()
        if deleted:
            SnapshotBucket.objects.filter(run_id=run_id).delete()
            drop_summary(run_id)  # the leaderboard's figures of this run are computed again
            SnapshotCursor.objects.filter(run_id=run_id).update(seq=0, shift=0, max_step=None)
            Run.objects.filter(pk=run_id).update(metrics_seq=F("metrics_seq") + 1)
            with connection.cursor() as cursor:
                fold_pending_batches(cursor, run_id)
            # The checkpoint list shows the scores at each step: those after `step` went.
            services.announce_run_panel_changed(run_id)
    if deleted:
        logger.info("run %s resumed at step %d: %d points of the rewound steps dropped", run_id, step, deleted)
    return deleted


# ---------------------------------------------------------------- organise


def clean_tags(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        raise BadActionInput({"tags": ["must be a list of strings"]})
    tags = list(dict.fromkeys(tag.strip() for tag in value if tag.strip()))
    bad = [tag for tag in tags if not TAG_RE.match(tag)]
    if bad:
        raise BadActionInput({"tags": [f"{bad[0][:50]!r}: a tag is 1-40 letters, digits or . : / + - _"]})
    if len(tags) > MAX_TAGS:
        raise BadActionInput({"tags": [f"at most {MAX_TAGS} tags"]})
    return tags


def update_run(run: Run, by_user: AbstractBaseUser, changes: Mapping[str, Any]) -> Run:
    """Tags, note and archived flag; only the owner may change them."""
    if run.owner_id != by_user.pk:
        raise PermissionDenied("only the run's owner may edit its tags, note or archive state")
    unknown = sorted(set(changes) - {"tags", "note", "archived"})
    if unknown:
        raise BadActionInput({name: ["not editable; send tags, note or archived"] for name in unknown})
    fields: dict[str, Any] = {}
    if "tags" in changes:
        fields["tags"] = clean_tags(changes["tags"])
    if "note" in changes:
        note = changes["note"]
        if not isinstance(note, str):
            raise BadActionInput({"note": ["must be a string"]})
        if len(note) > MAX_NOTE_CHARS:
            raise BadActionInput({"note": [f"at most {MAX_NOTE_CHARS} characters"]})
        fields["note"] = note
    if "archived" in changes:
        if not isinstance(changes["archived"], bool):
            raise BadActionInput({"archived": ["must be true or false"]})
        if changes["archived"] != run.archived:
            fields["archived_at"] = timezone.now() if changes["archived"] else None
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields)
        services.announce_run_panel_changed(run.pk)
    return Run.objects.select_related("owner", "parent").get(pk=run.pk)


def delete_run(run: Run, by_user: AbstractBaseUser) -> None:
    """The run's rows go now; its run directory is removed by a worker of its queue (the
    worker owns the run storage). Only the owner; only an ended run; never a run whose
    checkpoint a queued or running fork still starts from."""
    if run.owner_id != by_user.pk:
        raise PermissionDenied("only the run's owner may delete it")
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if locked.status not in TERMINAL_STATUSES:
            raise ActionRefused(f"run {run.pk} is {locked.status}; stop it before deleting it")
        # Not only its forks: a clone of a fork, or a run started from this run's checkpoint on
        # the create form ("start from checkpoint", no parent recorded), reads the same files.
        active = Run.objects.exclude(status__in=TERMINAL_STATUSES).exclude(pk=locked.pk)
        forks = sorted(
            {pk for pk in active.filter(parent=locked, parent_step__isnull=False).values_list("pk", flat=True)}
            | {pk for pk, path in active.values_list("pk", "config__model__path") if run_paths.checkpoint_run_id(path) == locked.pk}
        )
        if forks:
            raise ActionRefused(f"run(s) {', '.join(f'#{pk}' for pk in forks)} start from this run's checkpoints and have not ended")
        run_id, queue = locked.pk, locked.queue
        # Open pages of its parent (its list of runs made from it) and of its children (their
        # lineage line: "since deleted") change. At most 50 children are told (a run cloned 1,000
        # times sends no burst of pushes); the others' pages catch up at their slow safety poll.
        children = Run.objects.filter(parent=locked).order_by("id").values_list("pk", flat=True)[:50]
        for related in {locked.parent_id, *children} - {None}:
            services.announce_run_panel_changed(related)
        locked.delete()
        transaction.on_commit(lambda: dispatch_run_dir_removal(run_id, queue))


def dispatch_run_dir_removal(run_id: int, queue: str) -> None:
    from inflight.task_queue import app

    try:
        app.send_task(DELETE_RUN_DIR_TASK, args=[run_id], queue=queue, retry=False)
    except Exception:  # noqa: BLE001 - the rows are gone; the folder stays until removed by hand
        logger.error("could not ask a worker to remove the directory of deleted run %s", run_id, exc_info=True)
