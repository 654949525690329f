"""Small display filters of the pages: durations, figures, status badges."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.safestring import mark_safe

from inflight.runs.run_env import run_env_name

register = template.Library()


@register.filter
def duration(seconds: float | None) -> str:
    """`3725.0` → `1h 02m`; `42` → `42s`."""
    if seconds is None:
        return "—"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


@register.filter
def figure(value: Any, digits: int = 3) -> str:
    """A number with `digits` significant digits, or an em dash for missing."""
    if value is None or value == "":
        return "—"
    try:
        return f"{float(value):.{int(digits)}g}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def percent(value: Any) -> str:
    if value is None:
        return "—"
    return f"{100 * float(value):.1f}%"


@register.filter
def age(moment: datetime | None) -> str:
    """Seconds/minutes since `moment`, e.g. `12s ago`."""
    if moment is None:
        return "—"
    return duration((timezone.now() - moment).total_seconds()) + " ago"


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping[key]
    except (KeyError, IndexError, TypeError):
        return None


@register.filter
def sparkline(values: Any, size: str = "120x28") -> str:
    """A small inline SVG polyline of `values` (numbers only: nothing user-written reaches the
    markup); "—" when there are fewer than two."""
    numbers = [float(v) for v in (values or []) if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(numbers) < 2:
        return mark_safe('<span class="muted">—</span>')
    width, height = (int(part) for part in size.split("x"))
    low, high = min(numbers), max(numbers)
    span = (high - low) or 1.0
    points = " ".join(
        f"{i * (width - 2) / (len(numbers) - 1) + 1:.1f},{height - 2 - (v - low) / span * (height - 4):.1f}" for i, v in enumerate(numbers)
    )
    last_x, last_y = points.rsplit(" ", 1)[-1].split(",")
    return mark_safe(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="from {numbers[0]:.3g} to {numbers[-1]:.3g} (range {low:.3g} to {high:.3g})">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/>'
        f'<circle cx="{last_x}" cy="{last_y}" r="2" fill="currentColor"/></svg>'
    )


@register.filter
def env_name(config: Any) -> str:
    """A run config's env (`runs.run_env`): what marks a tool-using run beside a plain math one."""
    return run_env_name(config if isinstance(config, dict) else None)


@register.filter
def as_text(value: Any) -> str:
    """Config values in the diff table: JSON-ish for lists/dicts, plain otherwise."""
    import json

    if isinstance(value, (list, dict)):
        return json.dumps(value)
    if value is None:
        return "null"
    return str(value)


@register.inclusion_tag("inflight/_status.html")
def status_badge(status: str, run_id: int | None = None) -> dict[str, Any]:
    return {"status": status, "run_id": run_id}
