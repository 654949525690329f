"""Sweeps through the API: create one (a base config, a grid of dotted overrides, seeds), list them,
read one with its runs and their time to target.

A sweep is created whole or refused whole (`runs.sweeps.create_sweep`): bad input answers 400 naming
the field (`grid.<key>`, `seeds`, a config field); runs past the active-run limit wait in the
sweep (`statuses.waiting`) and are queued as the owner's runs end.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Body, Query
from ninja.responses import Status

from inflight.api import schema
from inflight.api.auth import ApiRouter, QueryInt, page_links
from inflight.api.errors import ApiError
from inflight.runs import group_selectors, services, sweeps
from inflight.runs.models import RunGroup
from inflight.runs.safe_input import MAX_INT

router = ApiRouter(tags=["sweeps"])

SWEEP_LIST_PAGE = 50
MAX_SWEEP_LIST_PAGE = 500


def _answer(group: RunGroup, counts: dict[str, Any], run_ids: list[int]) -> dict[str, Any]:
    return {
        "id": group.pk, "name": group.name, "owner": group.owner.get_username(), "created_at": group.created_at,
        "config": group.base_config, "grid": group.grid, "seeds": group.seeds, "run_count": counts.get("runs", 0),
        "statuses": {key: counts.get(key, 0) for key in ("queued", "running", "succeeded", "failed", "cancelled", "waiting")},
        "run_ids": run_ids, "refused": group.refused,
    }


@router.post("/sweeps/", response={201: schema.SweepDetail, 415: schema.Error, **schema.ERRORS}, url_name="sweeps",
             summary="Create a sweep and queue its runs (grid points x seeds)")
def create_sweep(request: HttpRequest, body: schema.SweepCreate = Body(schema.SweepCreate())) -> Any:
    try:
        group = sweeps.create_sweep(request.user, body.name, body.config, body.grid, body.seeds)
    except services.InvalidRunConfig as exc:
        raise ApiError(400, f"invalid sweep: {exc}", fields=exc.errors) from exc
    return Status(201, _detail(request, group, group_selectors.DEFAULT_TARGET))


@router.get("/sweeps/", response={200: schema.SweepList, **schema.ERRORS}, url_name="sweeps", summary="List sweeps, newest first, paged")
def list_sweeps(request: HttpRequest, limit: QueryInt = Query(SWEEP_LIST_PAGE, ge=1, le=MAX_SWEEP_LIST_PAGE),
                offset: QueryInt = Query(0, ge=0, le=MAX_INT)) -> Any:
    groups = group_selectors.groups_visible_to(request.user)
    count = groups.count()
    page = list(groups[offset:offset + limit])
    counts = group_selectors.group_counts(group.pk for group in page)
    members = group_selectors.group_run_ids([group.pk for group in page])
    return {"sweeps": [_answer(group, counts.get(group.pk, {}), members.get(group.pk, [])) for group in page],
            **page_links(request, count, offset, limit)}


def _detail(request: HttpRequest, group: RunGroup, target_text: str) -> dict[str, Any]:
    try:
        target = group_selectors.Target.parse(target_text)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc
    runs = list(group_selectors.group_runs_visible(request.user, group))
    per_run = group_selectors.time_to_target(runs, target)
    summary = group_selectors.group_time_to_target(per_run, [run.pk for run in runs])
    counts = group_selectors.group_counts([group.pk]).get(group.pk, {})
    return {**_answer(group, counts, [run.pk for run in runs]), "runs": runs, "time_to_target": {"target": target.text, **summary}}


@router.get("/sweeps/{int:sweep_id}/", response={200: schema.SweepDetail, **schema.ERRORS}, url_name="sweep-detail",
            summary="One sweep: its runs, their statuses and the group's time to target")
def get_sweep(request: HttpRequest, sweep_id: int,
              target: str = Query(group_selectors.DEFAULT_TARGET, description="+0.20: a gain over each run's first held-out value; 0.8: a held-out success")) -> Any:
    group = group_selectors.groups_visible_to(request.user).filter(pk=sweep_id).first()
    if group is None:
        raise ApiError(404, f"sweep {sweep_id} does not exist or is not yours")
    return _detail(request, group, target)
