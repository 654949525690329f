"""API of stored rollouts (token auth, like the rest of /api/):

    GET /api/runs/<id>/rollouts/   ?step_min=&step_max=&correct=&reward_min=&reward_max=
                                   &length_min=&length_max=&cursor=&limit=   → {"rollouts": [...], "next_cursor"}
    GET /api/runs/<id>/rollouts/<rollout id>/                                → one sample, token by token
    GET /api/runs/<id>/rollouts/<rollout id>/group/                          → its group's stored siblings
    GET /api/runs/<id>/export/<metrics.csv|metrics.parquet|rollouts.jsonl|evals.jsonl>  → a download

Newest first; repeat with `cursor=<next_cursor>` until it is null. Other users' runs answer 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from inflight.api.auth import ApiError, api_view
from inflight.runs.selectors import visible_run_or_404
from inflight.rollouts import selectors
from inflight.rollouts.exports import EXPORT_KINDS, export_response
from inflight.rollouts.models import StoredRollout
from inflight.rollouts.params import BadParam, rollout_filter


@api_view("GET")
def run_rollouts(request: HttpRequest, run_id: int) -> Any:
    run = visible_run_or_404(request.user, run_id)  # its Http404 is api_view's 404
    try:
        flt = rollout_filter(request.GET)
    except BadParam as exc:
        raise ApiError(400, str(exc)) from exc
    return selectors.rollouts_page(run, flt)


def _rollout(request: HttpRequest, run_id: int, rollout_id: int) -> tuple[Any, StoredRollout]:
    run = visible_run_or_404(request.user, run_id)  # its Http404 is api_view's 404
    if rollout_id > 2**63 - 1:
        raise ApiError(404, f"rollout {rollout_id} of run {run_id} not found")
    try:
        return run, selectors.rollout_detail(run, rollout_id)
    except StoredRollout.DoesNotExist as exc:
        raise ApiError(404, f"rollout {rollout_id} of run {run_id} not found (it may have been thinned)") from exc


@api_view("GET")
def rollout_detail(request: HttpRequest, run_id: int, rollout_id: int) -> Any:
    run, row = _rollout(request, run_id, rollout_id)
    return selectors.detail_json(row, selectors.trainer_kl_coef(run))


@api_view("GET")
def rollout_group(request: HttpRequest, run_id: int, rollout_id: int) -> Any:
    run, row = _rollout(request, run_id, rollout_id)
    return selectors.group_json(run, row)


@api_view("GET")
def _export_check(request: HttpRequest, run_id: int, kind: str) -> Any:
    """Auth, visibility and the kind, answered as JSON errors by `api_view`; the download itself
    is not JSON, so `run_export` builds it only after this said yes (it returns None then)."""
    run = visible_run_or_404(request.user, run_id)  # its Http404 is api_view's 404
    if kind not in EXPORT_KINDS:
        raise ApiError(404, f"unknown export {kind[:40]!r}; use one of {', '.join(EXPORT_KINDS)}")
    request.export_run = run  # type: ignore[attr-defined]
    return JsonResponse({})


def run_export(request: HttpRequest, run_id: int, kind: str) -> HttpResponse:
    """GET /api/runs/<id>/export/<metrics.csv|metrics.parquet|rollouts.jsonl|evals.jsonl>"""
    checked = _export_check(request, run_id, kind)
    run = getattr(request, "export_run", None)
    if run is None:
        return checked
    return export_response(run, kind)
