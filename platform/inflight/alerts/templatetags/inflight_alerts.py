"""`{% alert_counts runs as counts %}` (one query for the whole list) and `{{ run.pk|alert_count:counts }}`."""

from __future__ import annotations

from typing import Any, Iterable

from django import template

from inflight.alerts.services import alert_counts as _alert_counts

register = template.Library()


@register.simple_tag
def alert_counts(runs: Iterable[Any]) -> dict[int, int]:
    return _alert_counts([run.pk for run in runs])


@register.filter
def alert_count(run_id: int, counts: dict[int, int]) -> int:
    return counts.get(run_id, 0)
