"""GET /api/runs/<id>/alerts/: a run's alerts, newest first (token auth; others' runs 404)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query

from inflight.alerts.services import run_alerts
from inflight.api import schema
from inflight.api.auth import ApiRouter, QueryInt
from inflight.runs.selectors import visible_run_or_404

router = ApiRouter(tags=["metrics"])

# Alerts per answer when no `limit` is given, and the most one answer holds.
ALERTS_PAGE = 200
MAX_ALERTS_PAGE = 1000


@router.get("/runs/{int:run_id}/alerts/", response={200: schema.AlertList, **schema.ERRORS}, url_name="run-alerts", summary="Alerts, newest first")
def run_alerts_view(request: HttpRequest, run_id: int, limit: QueryInt = Query(ALERTS_PAGE, ge=1, le=MAX_ALERTS_PAGE)) -> Any:
    run = visible_run_or_404(request.user, run_id)
    return {"run": run.pk, "alerts": run_alerts(run, limit=limit)}
