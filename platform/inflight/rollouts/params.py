"""Query parameters of the rollout list, shared by the API and the page's JSON endpoint."""

from __future__ import annotations

import math
from typing import Mapping

import re

from inflight.rollouts.selectors import DISCARDED_ANY, MAX_PAGE_SIZE, PAGE_SIZE, TRAINED, RolloutFilter

MAX_INT = 2**62


class BadParam(ValueError):
    """A query parameter that cannot be used; the message names it (answered 400)."""


def _int(query: Mapping[str, str], name: str, minimum: int = 0, maximum: int = MAX_INT) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > 20 or not raw.lstrip("-").isdigit():
        raise BadParam(f"query parameter {name!r} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise BadParam(f"query parameter {name!r} must be between {minimum} and {maximum}")
    return value


def _float(query: Mapping[str, str], name: str) -> float | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw[:40])
    except ValueError as exc:
        raise BadParam(f"query parameter {name!r} must be a number, got {raw[:40]!r}") from exc
    if not math.isfinite(value):
        raise BadParam(f"query parameter {name!r} must be a finite number")
    return value


def _bool(query: Mapping[str, str], name: str) -> bool | None:
    raw = (query.get(name) or "").lower()
    if raw == "":
        return None
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    raise BadParam(f"query parameter {name!r} must be true or false, got {raw[:40]!r}")


_REASON = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _discarded(query: Mapping[str, str]) -> str | None:
    """`discarded`: empty every row; false the trained ones; true every discarded one; a reason
    (zero_advantage, aborted, ...) the ones discarded for it. A reason is not checked against the
    known ones: a newer engine's reason is stored as written and must be filterable."""
    raw = (query.get("discarded") or "").strip().lower()
    if raw == "":
        return None
    if raw in ("0", "false", "no"):
        return TRAINED
    if raw in ("1", "true", "yes"):
        return DISCARDED_ANY
    if not _REASON.fullmatch(raw):
        raise BadParam(f"query parameter 'discarded' must be true, false or a discard reason, got {raw[:40]!r}")
    return raw


def rollout_filter(query: Mapping[str, str]) -> RolloutFilter:
    flt = RolloutFilter(
        step_min=_int(query, "step_min"), step_max=_int(query, "step_max"), correct=_bool(query, "correct"),
        reward_min=_float(query, "reward_min"), reward_max=_float(query, "reward_max"),
        length_min=_int(query, "length_min"), length_max=_int(query, "length_max"), discarded=_discarded(query),
        cursor=_int(query, "cursor"),
        limit=_int(query, "limit", minimum=1, maximum=MAX_PAGE_SIZE) or PAGE_SIZE,
    )
    if flt.step_min is not None and flt.step_max is not None and flt.step_min > flt.step_max:
        raise BadParam("step_min is larger than step_max")
    return flt
