"""The compare page's groups: sweeps (and single runs, each a group of one) compared as
distributions, and the time to target of every compared run and group.

The compare view (`web.run_actions.compare`) reads `?groups=` here; compare.js draws each group's
curve as the mean over its runs with a band (min–max or ±1 sd, `?band=`). A failed run is never
left out silently: its partial curve is in the group's mean up to where it stopped, and the page
says how many of each group's runs failed.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from inflight.runs.group_selectors import (
    FAILED_STATUSES,
    Target,
    group_time_to_target,
    groups_visible_to,
    time_to_target,
)
from inflight.runs.models import Run, RunGroup
from inflight.runs.selectors import runs_visible_to

BANDS = {"minmax": "min–max over the group's runs", "sd": "mean ± 1 sd over the group's runs"}


class GroupNotVisible(LookupError):
    """A `groups` id that does not exist or is not the user's."""


def group_runs(user: AbstractBaseUser, group_ids: list[int]) -> tuple[list[RunGroup], dict[int, list[Run]]]:
    """The groups asked for (in that order) and each one's visible runs, oldest first: two queries."""
    found = {group.pk: group for group in groups_visible_to(user).filter(pk__in=group_ids)}
    missing = [pk for pk in group_ids if pk not in found]
    if missing:
        raise GroupNotVisible(f"Sweep(s) {', '.join(str(pk) for pk in missing)} do not exist or are not yours.")
    members: dict[int, list[Run]] = {pk: [] for pk in group_ids}
    for run in runs_visible_to(user).filter(group_id__in=group_ids).select_related("parent").order_by("id"):
        members[run.group_id].append(run)
    return [found[pk] for pk in group_ids], members


def _status_counts(runs: list[Run]) -> dict[str, int]:
    failed = sum(run.status in FAILED_STATUSES for run in runs)
    succeeded = sum(run.status == "succeeded" for run in runs)
    ended = sum(run.is_terminal for run in runs)
    return {"runs": len(runs), "failed": failed, "succeeded": succeeded, "active": len(runs) - ended, "cancelled": ended - failed - succeeded}


def compare_groups(groups: list[RunGroup], members: dict[int, list[Run]], loose: list[Run]) -> tuple[list[Run], list[dict[str, Any]]]:
    """(every compared run, in the order the page draws them; each group as the page describes it:
    `{"key", "label", "kind", "run_ids", counts...}`). A loose run is a group of one."""
    runs: list[Run] = []
    described = []
    in_groups = {run.pk for runs_of in members.values() for run in runs_of}
    for group in groups:
        runs_of = members[group.pk]
        runs.extend(runs_of)
        described.append({"key": f"g{group.pk}", "id": group.pk, "label": group.name, "kind": "sweep",
                          "run_ids": [run.pk for run in runs_of], **_status_counts(runs_of), "waiting": len(group.waiting)})
    for run in loose:
        if run.pk in in_groups:
            continue  # listed on its own and in a compared sweep: it is counted once, in its sweep
        runs.append(run)
        described.append({"key": f"r{run.pk}", "id": run.pk, "label": f"#{run.pk} {run.name}", "kind": "run",
                          "run_ids": [run.pk], **_status_counts([run])})
    return runs, described


def time_to_target_rows(runs: list[Run], groups: list[dict[str, Any]] | None, target: Target) -> dict[str, Any]:
    """What the compare page's time-to-target table shows: per run, and per group (mean ± sd over
    the runs that reached the target, with how many did) when groups are compared."""
    per_run = time_to_target(runs, target)
    return {
        "target": target,
        "runs": [{"run": run, **per_run[run.pk]} for run in runs],
        "groups": [{**group, "summary": group_time_to_target(per_run, group["run_ids"])} for group in groups or []],
    }


def leaderboard_sweeps(user: AbstractBaseUser, page_run_ids: list[int], target: Target) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """The leaderboard page's time to target: per run of the page, and a row per sweep that one of
    the page's runs belongs to, in the order they first appear there (mean ± sd over all the sweep's
    visible runs, with how many reached the target and how many failed: a recipe in one line).
    Bounded by the page: at most a page of sweeps, each of at most MAX_SWEEP_RUNS runs."""
    page_runs = list(Run.objects.filter(pk__in=page_run_ids).only("id", "config", "group_id"))
    order = {run_id: index for index, run_id in enumerate(page_run_ids)}
    first_seen: dict[int, int] = {}
    for run in page_runs:
        if run.group_id is not None:
            first_seen[run.group_id] = min(first_seen.get(run.group_id, len(order)), order[run.pk])
    # A run the user sees is in a sweep the user sees (its owner's), so group_runs finds them all.
    groups, members = group_runs(user, sorted(first_seen, key=first_seen.__getitem__)) if first_seen else ([], {})
    on_page = {run.pk for run in page_runs}
    per_run = time_to_target(page_runs + [run for runs in members.values() for run in runs if run.pk not in on_page], target)
    sweeps = [
        {"id": group.pk, "name": group.name, **_status_counts(members[group.pk]),
         "summary": group_time_to_target(per_run, [run.pk for run in members[group.pk]])}
        for group in groups
    ]
    return per_run, sweeps
