"""Runs and what they report: metric points, evaluation scores, per-problem results, workers.

`MetricPoint` is a narrow table (one row per metric value) so any metric a run
logs is stored without schema changes; `(run, line, name)` is unique, where
`line` is the source line number in the run's `metrics.jsonl`, so re-sending a
batch never duplicates points.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from inflight.runs.statuses import ACTIVE_STATUSES, TERMINAL_STATUSES, RunStatus  # noqa: F401 - re-exported: the model's choices
from rl_core.rundir.layout import ENDED_REASONS


# The state machine, enforced by `services.transition_run`. A run that finishes
# before the worker saw it running may go straight from `starting` to an end state;
# a cancel racing with the natural end may still end `succeeded` or `failed`.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.STARTING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.STARTING: frozenset(
        {RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLING, RunStatus.LOST}
    ),
    RunStatus.RUNNING: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLING, RunStatus.LOST}),
    RunStatus.CANCELLING: frozenset({RunStatus.CANCELLED, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.LOST}),
    RunStatus.SUCCEEDED: frozenset(),
    # `queued` again: the owner resumed the run from its latest checkpoint (`services.resume_run`
    # checks that one exists; the worker then starts the engine with `--resume`).
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.QUEUED}),
    # A lost run is resolved later only by what is known for sure: its run directory read by
    # the restarted worker that owned it (`workers/reconcile.py`), or a cancel by its owner.
    RunStatus.LOST: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.QUEUED}),
}

# Where a resume may start from: a run that ended without finishing its steps.
RESUMABLE_STATUSES = frozenset({RunStatus.FAILED, RunStatus.LOST, RunStatus.CANCELLED})


class RunQueue(models.TextChoices):
    CPU = "cpu", "CPU"
    GPU = "gpu", "GPU"
    # Runs across several machines (`cluster.enabled`): a worker of this queue drives them on its Ray cluster.
    CLUSTER = "cluster", "Ray cluster"


class RunGroup(models.Model):
    """A sweep: runs of one base config over a grid of dotted overrides and/or seeds, compared as
    a distribution (`inflight.runs.sweeps`). Its runs point to it; the grid and seeds are kept as
    asked, so the group says what it was meant to hold even after a run is deleted."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_groups")
    name = models.CharField(max_length=120)
    base_config = models.JSONField(help_text="The config every run starts from, before its grid point and seed.")
    grid = models.JSONField(default=dict, blank=True, help_text="{dotted key: [values]}: every combination is a run (per seed).")
    seeds = models.JSONField(default=list, blank=True, help_text="The `seed` values each grid point runs with.")
    waiting = models.JSONField(
        default=list, blank=True,
        help_text="Runs past the owner's active-run limit, validated and waiting for a free slot: [{point, name, config}], queued in order as runs end.",
    )
    refused = models.JSONField(
        default=list, blank=True, help_text="Waiting runs the platform refused when their turn came (a path gone): [{point, name, error}].",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"group {self.pk} {self.name}"


class Run(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=120, help_text="Human-readable run name.")
    config = models.JSONField(help_text="The resolved rl_core RunConfig (validated on create).")
    queue = models.CharField(max_length=8, choices=RunQueue.choices, default=RunQueue.CPU, help_text="Celery queue: `cluster` for cluster.enabled, else from RunConfig.needs_gpu.")
    status_detail = models.CharField(
        max_length=500, blank=True, default="",
        help_text="What a starting run waits for, in the launcher's words (a cluster run's placement group); empty otherwise.",
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    error = models.TextField(blank=True, default="", help_text="Why the run failed or was lost.")
    ended_reason = models.CharField(
        max_length=16, blank=True, default="", choices=[(code, label) for code, label in ENDED_REASONS.items()],
        help_text="Why an ended run ended (rl_core.rundir.layout.EndedReason): its steps done, its wall-time budget, cancelled, failed, hung, lost; empty while it has not ended.",
    )
    ended_detail = models.CharField(
        max_length=300, blank=True, default="",
        help_text="That in words with the step it ended at (run_dir.ended_sentence), e.g. 'stopped by its wall-time budget (max_wall_time_s 60 s) at step 16 of 1000'.",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    worker_name = models.CharField(max_length=200, blank=True, default="", help_text="Celery worker that runs it.")
    worker_incarnation = models.CharField(
        max_length=64, blank=True, default="", help_text="Process id (uuid) of the worker process that claimed it: liveness is per process, not per name."
    )
    reconciled_at = models.DateTimeField(null=True, blank=True, help_text="When a restarted worker settled it from its run directory.")
    run_dir = models.CharField(max_length=500, blank=True, default="", help_text="The run directory on the worker.")
    # Incremented once per ingested metrics batch: the cursor of live snapshot + deltas.
    metrics_seq = models.BigIntegerField(default=0)
    # Lineage: a clone records its source run (parent_step None); a fork also the checkpoint
    # step its model came from. SET_NULL: deleting a parent keeps its children's history.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children",
        help_text="The run this one was cloned or forked from.",
    )
    parent_step = models.BigIntegerField(
        null=True, blank=True, help_text="The parent's checkpoint step this run's model is (a fork); empty for a clone."
    )
    parent_label = models.CharField(
        max_length=300, blank=True, default="",
        help_text="'#id name' of the parent when this run was made from it: the lineage still reads after the parent is deleted.",
    )
    earlier_attempts_s = models.FloatField(
        default=0.0,
        help_text="Seconds the run ran before its latest resume (each attempt from its start to its end): wall time leaves out the time it sat cancelled, failed or queued.",
    )
    resume_count = models.IntegerField(
        default=0, help_text="How many times the run was resumed; above 0 the worker starts the engine with --resume."
    )
    tags = models.JSONField(default=list, blank=True, help_text="Short labels chosen by the owner (list of strings).")
    note = models.TextField(blank=True, default="", help_text="Free text by the owner.")
    archived_at = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="Hidden from the default run list since then; empty: not archived."
    )
    # SET_NULL: deleting a sweep's record keeps its runs.
    group = models.ForeignKey(RunGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs",
                              help_text="The sweep this run belongs to.")
    group_point = models.JSONField(default=dict, blank=True, help_text="Its sweep point: {dotted key: value}, `seed` included.")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["owner", "-created_at"])]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name} ({self.status})"

    @property
    def status_note(self) -> str:
        """The words beside the status badge: what a starting run waits for, why an ended run ended."""
        return self.status_detail or self.ended_detail

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def is_resumable(self) -> bool:
        return self.status in RESUMABLE_STATUSES

    @property
    def archived(self) -> bool:
        return self.archived_at is not None

    @property
    def wall_time_s(self) -> float | None:
        """Seconds spent running: the attempts before the latest resume plus the latest one
        (`started_at` is the latest attempt's start; a resume moves the rest into
        `earlier_attempts_s`), never the time between a cancel and the resume."""
        if self.started_at is None:
            return self.earlier_attempts_s or None
        end = self.finished_at
        if end is None:
            from django.utils import timezone

            end = timezone.now()
        return self.earlier_attempts_s + (end - self.started_at).total_seconds()


# `Run.wall_time_s` in SQL, kept beside it: the leaderboard sorts by it in the database.
RUN_WALL_TIME_SQL = (
    f"CASE WHEN {Run._meta.db_table}.started_at IS NULL THEN NULLIF({Run._meta.db_table}.earlier_attempts_s, 0) "
    f"ELSE {Run._meta.db_table}.earlier_attempts_s + EXTRACT(EPOCH FROM COALESCE({Run._meta.db_table}.finished_at, NOW()) - {Run._meta.db_table}.started_at) END"
)


class MetricPoint(models.Model):
    # No database-level foreign key: PostgreSQL would run a referential-integrity check per
    # inserted row (~1.5-2x slower bulk ingest). `live.ingest.ingest_metrics` locks the run row in
    # the same transaction, which proves the run exists; deletes still cascade through the ORM.
    # No index of its own either: the unique (run, line, name) and the two (run, ...) indexes below
    # serve every lookup by run, and a fourth index per point was PostgreSQL's work on every insert.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points", db_constraint=False, db_index=False)
    name = models.CharField(max_length=120)
    step = models.BigIntegerField()
    t = models.FloatField(help_text="Unix seconds when the value was logged.")
    value = models.FloatField()
    line = models.BigIntegerField(help_text="Idempotency key: source line number in metrics.jsonl.")
    seq = models.BigIntegerField(help_text="Run.metrics_seq of the batch that stored this point.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "line", "name"], name="metricpoint_run_line_name_uniq")]
        indexes = [
            models.Index(fields=["run", "name", "step"], name="metricpoint_run_name_step"),
            models.Index(fields=["run", "seq"], name="metricpoint_run_seq"),
        ]


class EvalScore(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="eval_scores")
    benchmark = models.CharField(max_length=40)
    step = models.BigIntegerField()
    k = models.IntegerField()
    mean_at_k = models.FloatField()
    pass_at_k = models.FloatField()
    stderr = models.FloatField(null=True, blank=True)
    num_problems = models.IntegerField()
    num_samples = models.IntegerField()
    policy_versions = models.JSONField(default=list)
    t = models.FloatField()
    results_file = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["run", "benchmark", "step"]
        constraints = [models.UniqueConstraint(fields=["run", "benchmark", "step"], name="evalscore_run_bench_step_uniq")]


class EvalProblemResult(models.Model):
    # Looked up by the unique (eval, problem_id) index: no second index on `eval` alone.
    eval = models.ForeignKey(EvalScore, on_delete=models.CASCADE, related_name="problem_results", db_index=False)
    problem_id = models.CharField(max_length=200)
    problem = models.TextField(blank=True, default="", help_text="The problem's statement as asked (empty for evaluations written before it was recorded).")
    answer = models.TextField(blank=True, default="")
    samples = models.JSONField(default=list)
    extracted = models.JSONField(default=list)
    verdicts = models.JSONField(default=list)
    mean = models.FloatField()
    passed = models.BooleanField(default=False)
    used_tool = models.BooleanField(
        null=True, blank=True, help_text="A sample of this problem called a tool (a tool-using env's evaluation); null: not recorded (no tool env)."
    )
    samples_used_tool = models.JSONField(
        null=True, blank=True, help_text="Per sample (aligned with samples): it called a tool; null: not recorded (no tool env)."
    )

    class Meta:
        ordering = ["eval", "id"]
        constraints = [models.UniqueConstraint(fields=["eval", "problem_id"], name="evalproblem_eval_problem_uniq")]


class Worker(models.Model):
    name = models.CharField(max_length=200, unique=True, help_text="Celery worker node name (celery@host).")
    hostname = models.CharField(max_length=200)
    queues = models.JSONField(default=list)
    gpus = models.JSONField(default=list, help_text="[{index, name, memory_total_mb, memory_used_mb, utilization}] from NVML.")
    cpu_count = models.IntegerField(default=0)
    pid = models.IntegerField(null=True, blank=True)
    incarnation = models.CharField(max_length=64, blank=True, default="", help_text="Process id (uuid) of the process now beating under this name.")
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField(db_index=True)
    cluster_nodes = models.JSONField(
        default=list, blank=True,
        help_text="A `cluster` worker's Ray nodes at its last heartbeat: [{node_id, address, hostname, alive, cpus, gpus, memory_gb}].",
    )
    cluster_error = models.CharField(max_length=500, blank=True, default="", help_text="Why a `cluster` worker could not read its Ray cluster.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RunSummary(models.Model):
    """A run's leaderboard figures, one row per run, so that a leaderboard of thousands of runs
    reads one row each instead of every point and evaluation (`inflight.runs.summaries`).

    Kept fresh at read time, not by ingest: `metrics_seq` is the Run.metrics_seq it was computed
    at (points of later batches are folded in incrementally), `evals_count` / `evals_max_t` the
    benchmark evaluations it saw (any change: those figures are read again; they are few)."""

    # No database-level foreign key: a summary written by a read racing with the run's delete
    # must not make that delete (or the read) fail at commit; deletes cascade through the ORM.
    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="summary", db_constraint=False)
    metrics_seq = models.BigIntegerField(default=0)
    evals_count = models.IntegerField(default=0)
    evals_max_t = models.FloatField(null=True, blank=True)
    heldout_best = models.FloatField(null=True, blank=True)
    heldout_last = models.FloatField(null=True, blank=True)
    aime24_best = models.FloatField(null=True, blank=True)
    aime24_last = models.FloatField(null=True, blank=True)
    math500_best = models.FloatField(null=True, blank=True)
    math500_last = models.FloatField(null=True, blank=True)
    success_best = models.FloatField(null=True, blank=True)
    success_last = models.FloatField(null=True, blank=True)
    success_recent = models.FloatField(null=True, blank=True)
    throughput = models.FloatField(null=True, blank=True)
    throughput_sum = models.FloatField(default=0.0)
    throughput_count = models.BigIntegerField(default=0)
    # The latest line of each of the last steps per series, [[step, line, value], ...] by step
    # descending: what an incremental update needs for `*_last` and the recent mean exactly.
    recent = models.JSONField(default=dict, blank=True)
