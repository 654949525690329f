"""API of stored rollouts and a run's downloads (token auth, like the rest of /api/): the list
(newest first; repeat with `cursor=<next_cursor>` until it is null), one sample token by token,
its group's stored siblings, and the exports. Other users' runs answer 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Schema
from pydantic import Field

from inflight.api import schema
from inflight.api.errors import ApiError
from inflight.api.auth import ApiRouter
from inflight.api.run_files import download
from inflight.runs.selectors import visible_run_or_404
from inflight.rollouts import selectors
from inflight.rollouts.exports import EXPORT_KINDS, export_response
from inflight.rollouts.models import StoredRollout
from inflight.rollouts.params import BadParam, rollout_filter

router = ApiRouter(tags=["rollouts"])


class RolloutFilters(Schema):
    """The rollout list's filters (parsed by rollouts.params, shared with the page's JSON endpoint)."""

    step_min: str | None = Field(None, description="Integer.")
    step_max: str | None = Field(None, description="Integer.")
    correct: str | None = Field(None, description="true or false.")
    reward_min: str | None = Field(None, description="Number.")
    reward_max: str | None = Field(None, description="Number.")
    length_min: str | None = Field(None, description="Completion tokens, integer.")
    length_max: str | None = Field(None, description="Completion tokens, integer.")
    discarded: str | None = Field(
        None, description="false: trained samples only; true: discarded ones only; a reason (zero_advantage, aborted, empty): "
        "those discarded for it. Empty: all."
    )
    cursor: str | None = Field(None, description="next_cursor of the previous page.")
    limit: str | None = Field(None, description=f"Rows per page, 1 to {selectors.MAX_PAGE_SIZE} (default {selectors.PAGE_SIZE}).")


@router.get("/runs/{int:run_id}/rollouts/", response={200: schema.RolloutPage, **schema.ERRORS}, url_name="run-rollouts",
            summary="Stored rollouts, newest first, paged by cursor")
def run_rollouts(request: HttpRequest, run_id: int, filters: Query[RolloutFilters]) -> Any:
    run = visible_run_or_404(request.user, run_id)
    try:
        flt = rollout_filter(request.GET)  # the declared filters, read by the parser the page shares
    except BadParam as exc:
        raise ApiError(400, str(exc)) from exc
    return selectors.rollouts_page(run, flt)


def _rollout(request: HttpRequest, run_id: int, rollout_id: int) -> tuple[Any, StoredRollout]:
    run = visible_run_or_404(request.user, run_id)
    if rollout_id > 2**63 - 1:
        raise ApiError(404, f"rollout {rollout_id} of run {run_id} not found")
    try:
        return run, selectors.rollout_detail(run, rollout_id)
    except StoredRollout.DoesNotExist as exc:
        raise ApiError(404, f"rollout {rollout_id} of run {run_id} not found (it may have been thinned)") from exc


@router.get("/runs/{int:run_id}/rollouts/{int:rollout_id}/", response={200: schema.RolloutDetail, **schema.ERRORS}, url_name="run-rollout",
            summary="One sample, token by token")
def rollout_detail(request: HttpRequest, run_id: int, rollout_id: int) -> Any:
    run, row = _rollout(request, run_id, rollout_id)
    return selectors.detail_json(row, selectors.trainer_kl_coef(run))


@router.get("/runs/{int:run_id}/rollouts/{int:rollout_id}/group/", response={200: schema.RolloutGroup, **schema.ERRORS}, url_name="run-rollout-group",
            summary="The sample's group: its stored siblings with rewards and advantages")
def rollout_group(request: HttpRequest, run_id: int, rollout_id: int) -> Any:
    run, row = _rollout(request, run_id, rollout_id)
    return selectors.group_json(run, row)


@router.get("/runs/{int:run_id}/export/{kind}", response=schema.ERRORS, tags=["metrics"], url_name="run-export",
            summary="A download of the run's data",
            description="kind: " + ", ".join(EXPORT_KINDS) + ". metrics.csv is long (step, t, name, value, line); "
            "metrics_wide.csv has one column per metric.",
            openapi_extra=download("application/octet-stream", "The file, as an attachment."))
def run_export(request: HttpRequest, run_id: int, kind: str) -> Any:
    run = visible_run_or_404(request.user, run_id)
    if kind not in EXPORT_KINDS:
        raise ApiError(404, f"unknown export {kind[:40]!r}; use one of {', '.join(EXPORT_KINDS)}")
    return export_response(run, kind)
