"""GET /api/runs/<id>/alerts/ → {"run", "alerts": [...newest first]} (token auth; others' runs 404)."""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpRequest

from inflight.alerts.services import run_alerts
from inflight.api.auth import ApiError, api_view, int_param
from inflight.runs.models import Run
from inflight.runs.selectors import visible_run_or_404


def _visible_run(request: HttpRequest, run_id: int) -> Run:
    """The run if the caller may see it (owner or staff); others' runs answer 404."""
    try:
        return visible_run_or_404(request.user, run_id)
    except Http404 as exc:
        raise ApiError(404, f"run {run_id} not found") from exc


@api_view("GET")
def run_alerts_view(request: HttpRequest, run_id: int) -> Any:
    run = _visible_run(request, run_id)
    limit = int_param(request, "limit", default=200, minimum=1, maximum=1000)
    return {"run": run.pk, "alerts": run_alerts(run, limit=limit or 200)}
