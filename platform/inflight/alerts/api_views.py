"""GET /api/runs/<id>/alerts/ → {"run", "alerts": [...newest first]} (token auth; others' runs 404)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from inflight.alerts.services import run_alerts
from inflight.api.auth import api_view, int_param
from inflight.runs.selectors import visible_run_or_404


@api_view("GET")
def run_alerts_view(request: HttpRequest, run_id: int) -> Any:
    run = visible_run_or_404(request.user, run_id)  # its Http404 is api_view's 404
    limit = int_param(request, "limit", default=200, minimum=1, maximum=1000)
    return {"run": run.pk, "alerts": run_alerts(run, limit=limit or 200)}
