"""The create page's policy-lag side panel (`{% lag_prediction_panel %}`): one tag, so the create
page's template only gains a line and its assumption inputs come from `LagAssumptions` itself."""

from __future__ import annotations

from typing import Any

from django import template

from rl_core.actor.lag_prediction import LagAssumptions

register = template.Library()


@register.inclusion_tag("inflight/_lag_prediction_panel.html")
def lag_prediction_panel() -> dict[str, Any]:
    defaults = LagAssumptions()
    fields = [
        {"name": name, "value": getattr(defaults, name), "help": info.description}
        for name, info in LagAssumptions.model_fields.items()
    ]
    return {"assumptions": fields}
