from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from inflight.runs.statuses import TERMINAL_STATUSES
from rl_core.common.metric_names import METRIC_NAMES_FOR_PAGES


def run_statuses(request: HttpRequest) -> dict[str, Any]:
    """`terminal_statuses`: the statuses a run never leaves on its own, for the pages' scripts
    (base.html hands them to static/inflight/run_status.js)."""
    return {"terminal_statuses": sorted(TERMINAL_STATUSES)}


def metric_names(request: HttpRequest) -> dict[str, Any]:
    """`metric_names`: the metric names templates and scripts read (constant name → metric, from
    rl_core/common/metric_names.py), so no page spells one itself; base.html hands them to
    static/inflight/run_status.js as `InflightRuns.metricNames`."""
    return {"metric_names": METRIC_NAMES_FOR_PAGES}
