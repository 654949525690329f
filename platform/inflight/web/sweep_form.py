"""The create page's Sweep panel: the Form tab's config launched as a sweep (grid rows of a dotted
key and comma-separated values, and seeds), through `runs.sweeps.create_sweep` like the API and CLI.

Values are read as the CLI reads `--grid` (YAML scalars: `1e-4` is a number, `true` a boolean).
"""

from __future__ import annotations

from typing import Any

import yaml
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest

from inflight.runs.models import RunGroup
from inflight.runs.sweeps import InvalidSweep, create_sweep

GRID_ROWS = 3  # rows the panel shows empty; "Add a row" adds more


def asked(request: HttpRequest) -> bool:
    return request.method == "POST" and request.POST.get("sweep") == "1"


# The refusals that name the sweep itself rather than a config field: shown in the panel.
SWEEP_FIELDS = ("grid", "seeds", "name")


def form_state(request: HttpRequest, errors: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """What the panel shows: the posted sweep fields kept after a refusal (with the refusals that
    name the grid, the seeds or the sweep's name), else empty rows."""
    post = request.POST if request.method == "POST" else {}
    keys = post.getlist("grid_key") if post else []
    values = post.getlist("grid_values") if post else []
    rows = [{"key": key, "values": value} for key, value in zip(keys, values) if key.strip() or value.strip()]
    rows += [{"key": "", "values": ""}] * max(1, GRID_ROWS - len(rows))
    problems = [f"{field}: {message}" for field, messages in (errors or {}).items()
                if field.split(".")[0] in SWEEP_FIELDS for message in messages] if asked(request) else []
    return {"errors": problems, "on": asked(request), "name": post.get("sweep_name", "") if post else "", "seeds": post.get("sweep_seeds", "1") if post else "1", "rows": rows}


def _scalar(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        # YAML 1.1 leaves 3e-4 as text; a researcher means a number.
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def parse_grid(keys: list[str], values: list[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    errors: dict[str, list[str]] = {}
    for key, raw in zip(keys, values):
        key, raw = key.strip(), raw.strip()
        if not key and not raw:
            continue
        if not key or not raw:
            errors.setdefault(f"grid.{key or '?'}", []).append("a grid row needs a dotted key and comma-separated values")
            continue
        grid[key] = [_scalar(part.strip()) for part in raw.split(",") if part.strip()]
    if errors:
        raise InvalidSweep(errors)
    return grid


def parse_seeds(text: str) -> int | list[int]:
    text = text.strip() or "1"
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isdigit() and len(part) < 10 for part in parts):
        raise InvalidSweep({"seeds": [f"{text[:30]!r}: a count (3) or a list of seeds (0, 1, 7)"]})
    return int(parts[0]) if len(parts) == 1 and "," not in text else [int(part) for part in parts]


def create_from_post(request: HttpRequest, owner: AbstractBaseUser, config: dict[str, Any]) -> RunGroup:
    """The sweep the panel asks for, over the form's config (InvalidSweep / RunLimitExceeded, nothing stored)."""
    post = request.POST
    grid = parse_grid(post.getlist("grid_key"), post.getlist("grid_values"))
    return create_sweep(owner, post.get("sweep_name", ""), config, grid, parse_seeds(post.get("sweep_seeds", "1")))
