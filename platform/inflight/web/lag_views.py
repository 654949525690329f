"""The policy-lag prediction (`rl_core/actor/lag_prediction.py`) on the pages: the create page's side
panel asks `runs/new/lag.json` as the form changes; the run page's Timeline tab asks
`runs/<id>/lag.json` for the same prediction of the run's stored config beside the lag the run
measured (`policy_lag/share/<k>`, `policy_lag/mean`, `train/dropped_stale`, from its stored points).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET, require_POST
from pydantic import ValidationError

from inflight.api.errors import error_response, json_response
from inflight.runs.selectors import metric_points_page, visible_run_or_404
from inflight.web.config_form import config_from_post, parse_yaml_config
from inflight.web.views import json_login_required
from rl_core.actor.lag_prediction import LAG_BINS, LagAssumptions, predict_lag
from rl_core.config.files import field_errors, with_run_defaults
from rl_core.config.run_config import RunConfig

ASSUME_PREFIX = "assume."  # the panel's assumption inputs: assume.<LagAssumptions field>
SHARE_METRICS = [f"policy_lag/share/{k}{'+' if k == LAG_BINS - 1 else ''}" for k in range(LAG_BINS)]
MEASURED_METRICS = [*SHARE_METRICS, "policy_lag/mean", "train/dropped_stale", "train/samples_consumed"]


def assumptions_from(post: Any) -> LagAssumptions:
    values = {key[len(ASSUME_PREFIX):]: value for key, value in post.items() if key.startswith(ASSUME_PREFIX) and value != ""}
    return LagAssumptions.model_validate(values)


def _first_error(exc: ValidationError, prefix: str = "") -> str:
    errors = field_errors(exc)
    path, messages = next(iter(errors.items()))
    return f"{prefix}{path}: {messages[0]}"


@json_login_required
@require_POST
def run_create_lag_json(request: HttpRequest) -> HttpResponse:
    """The prediction for the config the create page holds (its form fields, or `config_yaml` with
    `mode=yaml`), under the panel's assumptions; 400 naming the first field that does not validate."""
    if request.POST.get("mode") == "yaml":
        data, problem = parse_yaml_config(request.POST.get("config_yaml", ""))
        if problem or data is None:
            return error_response(400, f"config_yaml: {problem}")
    else:
        data, errors, _ = config_from_post(request.POST)
        if errors:
            path, messages = next(iter(errors.items()))
            return error_response(400, f"{path}: {messages[0]}")
    try:
        config = RunConfig.model_validate(with_run_defaults(dict(data)))
    except ValidationError as exc:
        return error_response(400, _first_error(exc))
    try:
        assumptions = assumptions_from(request.POST)
    except ValidationError as exc:
        return error_response(400, _first_error(exc, ASSUME_PREFIX))
    return json_response({"prediction": predict_lag(config, assumptions).model_dump(), "assumptions": assumptions.model_dump()})


def measured_lag(points: list[list[Any]]) -> dict[str, Any] | None:
    """The run's lag as it logged it: each step's shares averaged over its steps (every step trains
    the same number of samples), the mean lag likewise, and its stale drops over samples consumed."""
    by_step: dict[int, dict[str, float]] = {}
    for name, step, _t, value in points:
        by_step.setdefault(int(step), {})[name] = float(value)
    steps = [values for values in by_step.values() if "policy_lag/mean" in values]
    if not steps:
        return None
    last = by_step[max(step for step, values in by_step.items() if "policy_lag/mean" in values)]
    return {
        "steps": len(steps),
        "shares": [sum(values.get(name, 0.0) for values in steps) / len(steps) for name in SHARE_METRICS],
        "mean": sum(values["policy_lag/mean"] for values in steps) / len(steps),
        "dropped_stale_share": last.get("train/dropped_stale", 0.0) / max(1.0, last.get("train/samples_consumed", 1.0)),
    }


@json_login_required
@require_GET
def run_lag_json(request: HttpRequest, run_id: int) -> HttpResponse:
    """The prediction made from the run's config (default assumptions, as the create page opened on)
    and what the run measured so far (null before its first step)."""
    run = visible_run_or_404(request.user, run_id)
    try:
        config = RunConfig.model_validate(run.config)
    except ValidationError as exc:  # a run stored before a schema change
        return error_response(409, f"the run's config no longer validates ({_first_error(exc)}): no prediction")
    _, points, _ = metric_points_page(run, 0, MEASURED_METRICS)
    return json_response({"prediction": predict_lag(config).model_dump(), "measured": measured_lag(points)})
