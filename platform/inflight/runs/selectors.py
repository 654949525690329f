"""Every read of runs and what they report, already filtered by who may see it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, F, FloatField, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import Collate
from django.http import Http404
from django.utils import timezone

from inflight.runs.models import RUN_WALL_TIME_SQL, EvalProblemResult, EvalScore, MetricPoint, Run, Worker
from inflight.runs.run_env import run_env_name
from inflight.runs.run_filters import RunFilters, filter_runs
from inflight.runs.summaries import SUMMARY_FIGURES, refresh_summaries


# The access rule of runs, in its two forms: a run's owner and staff may see and manage it
# (`can_manage_run`, one run), the query of every run a user may see (`runs_visible_to`).


def can_manage_run(user: AbstractBaseUser, run: Run) -> bool:
    return bool(user.is_authenticated and (user.is_staff or run.owner_id == user.pk))


def runs_visible_to(user: AbstractBaseUser) -> QuerySet[Run]:
    """Own runs; staff see every run; anonymous users none (`can_manage_run` as a query)."""
    if not user.is_authenticated:
        return Run.objects.none()
    runs = Run.objects.select_related("owner")
    return runs if user.is_staff else runs.filter(owner=user)


# Primary keys are PostgreSQL bigints: a larger id (from a URL) is simply not a run, and must
# not reach the database, which would refuse it with an error.
MAX_RUN_ID = 2**63 - 1


def visible_run_or_404(user: AbstractBaseUser, run_id: int) -> Run:
    """The run if `user` may see it; otherwise Http404, the same answer whether the run does not
    exist or belongs to someone else (others' runs are not revealed). Every view of one run
    (API, pages, their JSON endpoints, the live socket) goes through here."""
    if 0 <= run_id <= MAX_RUN_ID:
        try:
            return runs_visible_to(user).get(pk=run_id)
        except Run.DoesNotExist:
            pass
    raise Http404(f"run {run_id} does not exist or is not yours")


def metric_points_page(
    run: Run, since_seq: int, names: Iterable[str] | None = None, max_points: int = 50_000
) -> tuple[int, list[list[Any]], bool]:
    """Points stored in batches after `since_seq`, as `[name, step, t, value]`, ordered by (seq,
    line), at most about `max_points`, cut at a batch boundary.

    Returns (cursor, points, truncated): asking again with `since_seq=cursor` continues exactly
    where this page ended. A single batch larger than `max_points` is returned whole (a cursor
    cannot point inside a batch)."""
    seq = Run.objects.filter(pk=run.pk).values_list("metrics_seq", flat=True).get()
    points = MetricPoint.objects.filter(run=run, seq__gt=since_seq, seq__lte=seq)
    if names is not None:
        points = points.filter(name__in=list(names))
    ordered = points.order_by("seq", "line", "name")
    rows = list(ordered.values_list("seq", "name", "step", "t", "value")[: max_points + 1])
    if len(rows) <= max_points:
        return seq, [list(row[1:]) for row in rows], False
    first_excluded = rows[max_points][0]
    kept = [row for row in rows if row[0] < first_excluded]
    if not kept:  # one batch bigger than a page: send all of it
        kept = list(ordered.filter(seq=first_excluded).values_list("seq", "name", "step", "t", "value"))
        return first_excluded, [list(row[1:]) for row in kept], points.filter(seq__gt=first_excluded).exists()
    return kept[-1][0], [list(row[1:]) for row in kept], True


def eval_scores(run: Run) -> QuerySet[EvalScore]:
    return EvalScore.objects.filter(run=run).order_by("benchmark", "step")


def eval_detail(user: AbstractBaseUser, eval_id: int) -> EvalScore:
    """An evaluation of a run the user may see (EvalScore.DoesNotExist otherwise)."""
    return EvalScore.objects.select_related("run").get(pk=eval_id, run__in=runs_visible_to(user))


def eval_problem_results(score: EvalScore) -> QuerySet[EvalProblemResult]:
    return EvalProblemResult.objects.filter(eval=score).order_by("id")


# ---------------------------------------------------------------- leaderboard

LEADERBOARD_SORT_KEYS = (
    "heldout_last", "heldout_best", "aime24_best", "aime24_last", "math500_best", "math500_last",
    "success_recent", "success_best", "success_last", "throughput", "wall_time_s", "created_at", "name",
)
# What the leaderboard sorts by when asked for nothing: the first of these that every listed run
# has (held-out before benchmarks before the training batch), else the one most runs have.
DEFAULT_SORT_PREFERENCE = ("heldout_last", "math500_last", "aime24_last", "success_recent", "throughput", "created_at")
# Rows of one leaderboard page when the caller names no limit, and the most it may ask for.
LEADERBOARD_PAGE = 50
MAX_LEADERBOARD_PAGE = 1000


def _sort_expression(key: str) -> Any:
    if key in SUMMARY_FIGURES:
        return F(f"summary__{key}")
    if key == "wall_time_s":
        return RawSQL(RUN_WALL_TIME_SQL, [], output_field=FloatField())
    if key == "name":
        return Collate(F("name"), "C")  # code point order, as Python sorts strings
    return F(key)


def default_leaderboard_sort(counts: dict[str, int], total: int) -> str:
    """`-key` for the first of DEFAULT_SORT_PREFERENCE that all `total` listed runs have a
    figure in (`counts[key]` of them do); with none shared by all, the one the most runs have
    (ties: the preference order)."""
    if not total:
        return f"-{DEFAULT_SORT_PREFERENCE[0]}"
    key = max(DEFAULT_SORT_PREFERENCE, key=lambda k: (counts[k], -DEFAULT_SORT_PREFERENCE.index(k)))
    return f"-{key}"


@dataclass
class LeaderboardPage:
    rows: list[dict[str, Any]]
    sort: str
    count: int  # runs on every page together
    offset: int
    limit: int
    present: dict[str, int]  # per sort key: how many of the listed runs have a figure


def leaderboard_page(
    user: AbstractBaseUser, sort: str | None = None, filters: RunFilters | None = None, offset: int = 0, limit: int = LEADERBOARD_PAGE,
) -> LeaderboardPage:
    """One page of the leaderboard, sorted in the database over every listed run. A row per
    visible run: held-out success (the actor's held-out evaluation, mean@k) best/last, best/last
    mean@k on AIME 2024 and MATH-500, training-batch success (mean of the last
    RECENT_TRAIN_STEPS steps; best and last single batch too), mean throughput and wall time,
    read from the runs' summaries (`inflight.runs.summaries`, brought up to date first). Runs
    missing the sorted figure sort last either way; ties keep the run list's order (newest
    first). `filters` are the run list's (status, tag, name, owner, archived:
    `RunFilters.from_query(query, sort=False)`); None: every visible run."""
    if sort is not None and sort.lstrip("-") not in LEADERBOARD_SORT_KEYS:
        raise ValueError(f"unknown sort key {sort.lstrip('-')!r}; use one of {', '.join(LEADERBOARD_SORT_KEYS)}")
    limit = max(1, min(limit, MAX_LEADERBOARD_PAGE))
    offset = max(0, offset)
    visible = runs_visible_to(user)
    runs = filter_runs(visible, filters, user) if filters is not None else visible
    refresh_summaries(runs)
    counted = {key: Count(_sort_expression(key)) for key in LEADERBOARD_SORT_KEYS if key not in ("created_at", "name")}
    present = runs.order_by().aggregate(_total=Count("pk"), **counted)
    total = present.pop("_total")
    present.update(created_at=total, name=total)
    sort = sort if sort is not None else default_leaderboard_sort(present, total)
    key, descending = sort.lstrip("-"), sort.startswith("-")
    expression = _sort_expression(key)
    ordered = runs.select_related("summary").order_by(
        expression.desc(nulls_last=True) if descending else expression.asc(nulls_last=True),
        F("created_at").desc(nulls_last=True), "-id",
    )
    rows = []
    for run in ordered[offset:offset + limit]:
        summary = run.summary
        rows.append({
            "run_id": run.pk,
            "name": run.name,
            "owner": run.owner.get_username(),
            "status": run.status,
            "mode": run.config.get("mode"),
            "env": run_env_name(run.config),  # a tool-using run is told apart from a plain math one
            "created_at": run.created_at,
            "wall_time_s": run.wall_time_s,
            "throughput": summary.throughput,
            **{figure: getattr(summary, figure) for figure in SUMMARY_FIGURES if figure != "throughput"},
        })
    return LeaderboardPage(rows, sort, total, offset, limit, present)


def leaderboard(user: AbstractBaseUser, sort: str | None = None, filters: RunFilters | None = None) -> tuple[list[dict[str, Any]], str]:
    """(rows, the sort applied) of the first MAX_LEADERBOARD_PAGE rows (`leaderboard_page`)."""
    page = leaderboard_page(user, sort, filters, limit=MAX_LEADERBOARD_PAGE)
    return page.rows, page.sort


# ---------------------------------------------------------------- workers


def workers_with_liveness(user: AbstractBaseUser | None = None) -> list[dict[str, Any]]:
    """Workers and whether their heartbeat is recent. Staff (or `user=None`, internal use) see
    everything; other users see what sizes a run (queues, CPU count, GPU models and memory,
    liveness) but not the infrastructure: no host names, node names, pids or other users' load."""
    cutoff = timezone.now() - timedelta(seconds=settings.INFLIGHT_WORKER_LOST_AFTER_S)
    full = user is None or user.is_staff
    out = []
    for index, worker in enumerate(Worker.objects.all(), start=1):
        row = {
            "name": worker.name if full else f"worker {index}",
            "hostname": worker.hostname if full else "",
            "queues": worker.queues,
            "gpus": worker.gpus if full else [
                {"index": gpu.get("index"), "name": gpu.get("name"), "memory_total_mb": gpu.get("memory_total_mb")}
                for gpu in worker.gpus or [] if isinstance(gpu, dict)
            ],
            "cpu_count": worker.cpu_count,
            "started_at": worker.started_at,
            "last_heartbeat": worker.last_heartbeat,
            "alive": worker.last_heartbeat >= cutoff,
        }
        if full:
            row["active_runs"] = Run.objects.filter(worker_name=worker.name, status__in=["starting", "running", "cancelling"]).count()
        # A `cluster` worker's Ray nodes: sizes and liveness for everyone, addresses for staff.
        row["cluster_nodes"] = [
            {key: node.get(key) for key in ("alive", "cpus", "gpus", "memory_gb", *(("address", "hostname", "node_id") if full else ()))}
            for node in worker.cluster_nodes or [] if isinstance(node, dict)
        ]
        row["cluster_error"] = worker.cluster_error if full else ("the Ray cluster cannot be read" if worker.cluster_error else "")
        out.append(row)
    return out
