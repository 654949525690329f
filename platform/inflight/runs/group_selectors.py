"""Reads of sweeps (`RunGroup`) and of time to target, for the run list, compare, leaderboard and API.

Every read here takes a page's worth of ids and costs a fixed number of queries, however many
rows: the run list and compare stay within their 2,000-run figures (bench/scale_finished.py).

Time to target (`time_to_target`): a run reaches the target at its first held-out evaluation
(`success/heldout`, in step order) whose value is at least the target. The target is either the
run's first held-out value plus a gain (`+0.20` by default) or an absolute value (`0.8`). What it
took: wall time from the run's first logged metric (the first line of its metrics.jsonl) to that
evaluation's time, its step, and samples (step x trainer.samples_per_step). A run that never got
there is "not reached"; a group's figure is the mean ± sd over its runs that reached it, and says
how many of how many did.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import Count, F, Func, IntegerField, QuerySet

from inflight.runs.models import MetricPoint, Run, RunGroup
from inflight.runs.statuses import ACTIVE_STATUSES, RunStatus

HELDOUT_METRIC = "success/heldout"
DEFAULT_TARGET = "+0.20"
# The statuses a group's row counts apart: what a researcher asks of a sweep first.
FAILED_STATUSES = (RunStatus.FAILED, RunStatus.LOST)


def groups_visible_to(user: AbstractBaseUser) -> QuerySet[RunGroup]:
    """Own groups; staff see every group (as `runs_visible_to`)."""
    if not user.is_authenticated:
        return RunGroup.objects.none()
    groups = RunGroup.objects.select_related("owner")
    return groups if user.is_staff else groups.filter(owner=user)


def group_counts(group_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Per group id: its name, runs in all, and how many are queued / running / succeeded / failed
    (failed or lost) / cancelled, and how many wait for a free slot (not runs yet) or were refused
    when their turn came — two queries for any number of groups."""
    ids = sorted(set(group_ids))
    if not ids:
        return {}
    # The waiting and refused lists' lengths in the database: their configs are not read.
    lengths = {f"{field}_n": Func(F(field), function="jsonb_array_length", output_field=IntegerField()) for field in ("waiting", "refused")}
    out: dict[int, dict[str, Any]] = {
        pk: {"id": pk, "name": name, "runs": 0, "queued": 0, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0,
             "waiting": waiting, "refused": refused}
        for pk, name, waiting, refused in RunGroup.objects.filter(pk__in=ids).annotate(**lengths).values_list("pk", "name", "waiting_n", "refused_n")
    }
    rows = Run.objects.filter(group_id__in=ids).order_by().values("group_id", "status").annotate(n=Count("pk"))
    for row in rows:
        counts = out.get(row["group_id"])
        if counts is None:
            continue
        status, n = row["status"], row["n"]
        counts["runs"] += n
        if status == RunStatus.QUEUED:
            counts["queued"] += n
        elif status in ACTIVE_STATUSES:
            counts["running"] += n
        elif status == RunStatus.SUCCEEDED:
            counts["succeeded"] += n
        elif status in FAILED_STATUSES:
            counts["failed"] += n
        else:
            counts["cancelled"] += n
    return out


# ---------------------------------------------------------------- time to target


@dataclass(frozen=True)
class Target:
    """`+0.20`: the first held-out value plus 0.20; `0.8`: held-out success of 0.8."""

    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str | None) -> "Target":
        raw = (text or DEFAULT_TARGET).strip()
        relative = raw.startswith("+")
        try:
            value = float(raw[1:] if relative else raw)
        except ValueError:
            raise ValueError(f"target: {raw[:20]!r} is not a number; write +0.20 (a gain over the first held-out value) or 0.8 (a value)") from None
        if not math.isfinite(value) or not (0 < value <= 1 if relative else 0 <= value <= 1):
            raise ValueError(f"target: {raw[:20]!r} is out of range; a gain is in (0, 1], a value in [0, 1]")
        return cls(value, relative)

    @property
    def text(self) -> str:
        return f"+{self.value:.2f}" if self.relative else f"{self.value:g}"

    @property
    def words(self) -> str:
        if self.relative:
            return f"held-out success {self.value:+.2f} over the run's first held-out value"
        return f"held-out success of {self.value:g}"


def time_to_target(runs: list[Run], target: Target) -> dict[int, dict[str, Any]]:
    """Per run id: `{"reached", "target", "first", "wall_s", "steps", "samples", "evaluations"}`
    (None figures when not reached; `evaluations` 0: no held-out evaluation yet). Two indexed
    queries for the whole list (the held-out points, and each run's first metrics line)."""
    ids = [run.pk for run in runs]
    if not ids:
        return {}
    table = MetricPoint._meta.db_table
    series: dict[int, list[tuple[int, float, float]]] = {}
    first_t: dict[int, float] = {}
    with connection.cursor() as cursor:
        # Written as (run, name) pairs so that PostgreSQL walks the (run_id, name, step) index once per
        # run; `run_id = ANY(...) AND name = ...` read every point of those runs through the run_id
        # index and filtered the name (2,000-run bench: 780,000 rows read for 20,000, 3x the time).
        cursor.execute(
            f"SELECT run_id, step, t, value FROM {table} WHERE (run_id, name) IN (SELECT r, %s FROM unnest(%s::bigint[]) AS r) "
            "ORDER BY run_id, step, line",
            [HELDOUT_METRIC, ids],
        )
        for run_id, step, t, value in cursor.fetchall():
            series.setdefault(run_id, []).append((step, t, value))
        # One index probe per run (the unique (run, line, name) index), not a scan of its points.
        cursor.execute(
            f"SELECT r.id, (SELECT t FROM {table} p WHERE p.run_id = r.id ORDER BY p.line, p.name LIMIT 1) FROM unnest(%s::bigint[]) AS r(id)",
            [ids],
        )
        first_t = {run_id: t for run_id, t in cursor.fetchall() if t is not None}
    out = {}
    for run in runs:
        points = series.get(run.pk, [])
        samples_per_step = int(((run.config or {}).get("trainer") or {}).get("samples_per_step") or 1)
        row: dict[str, Any] = {"reached": False, "target": None, "first": None, "wall_s": None, "steps": None, "samples": None, "evaluations": len(points)}
        if points:
            first = points[0][2]
            goal = first + target.value if target.relative else target.value
            row.update(first=first, target=goal)
            for step, t, value in points:
                if value >= goal - 1e-12:
                    row.update(reached=True, steps=int(step), samples=int(step) * samples_per_step,
                               wall_s=t - first_t.get(run.pk, t))
                    break
        out[run.pk] = row
    return out


def mean_sd(values: list[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (None for fewer than two values)."""
    if not values:
        return {"mean": None, "sd": None}
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else None}


def group_time_to_target(per_run: dict[int, dict[str, Any]], run_ids: list[int]) -> dict[str, Any]:
    """A group's time to target over `run_ids`: how many reached it, and mean ± sd of each figure
    over those that did (a run that did not is counted, never averaged in as a number)."""
    rows = [per_run[run_id] for run_id in run_ids if run_id in per_run]
    reached = [row for row in rows if row["reached"]]
    return {
        "runs": len(rows), "reached": len(reached),
        **{key: mean_sd([float(row[key]) for row in reached]) for key in ("wall_s", "steps", "samples")},
    }


def group_run_ids(group_ids: list[int]) -> dict[int, list[int]]:
    """Per group id: its runs' ids, oldest first (one query)."""
    out: dict[int, list[int]] = {}
    for group_id, run_id in Run.objects.filter(group_id__in=group_ids).order_by("group_id", "id").values_list("group_id", "pk"):
        out.setdefault(group_id, []).append(run_id)
    return out


def group_runs_visible(user: AbstractBaseUser, group: RunGroup) -> QuerySet[Run]:
    """A group's runs that `user` may see, oldest first (its point order)."""
    from inflight.runs.selectors import runs_visible_to

    return runs_visible_to(user).filter(group=group).order_by("id")
