from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from inflight.runs.statuses import TERMINAL_STATUSES


def run_statuses(request: HttpRequest) -> dict[str, Any]:
    """`terminal_statuses`: the statuses a run never leaves on its own, for the pages' scripts
    (base.html hands them to static/inflight/run_status.js)."""
    return {"terminal_statuses": sorted(TERMINAL_STATUSES)}
