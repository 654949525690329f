"""Sweeps: one base config run over a grid of dotted overrides and a set of seeds, as a `RunGroup`.

Each run's config is the base with its grid point applied through
`rl_core.config.files.apply_overrides` (the same dotted `key=value` the engine's `--set` takes) and
`seed` set, then validated like any submitted run (`services.validate_run_config`,
`check_run_for_owner`). Every run is checked before any is stored, and the whole sweep is created
in one transaction: a sweep is queued whole or refused whole, never half-created.

The active-run limit (INFLIGHT_MAX_ACTIVE_RUNS_PER_USER): the runs that fit under it are queued
at once; the rest wait in the group (`RunGroup.waiting`, validated, in grid order) and are queued
one by one as the owner's runs end — `services.transition_run` calls `queue_waiting` after any
run of theirs reaches an end state. The group says how many wait; a waiting run refused when its
turn comes (a dataset path removed meanwhile) is kept in `RunGroup.refused` with why, never dropped.
"""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from inflight.runs import run_limits, services
from inflight.runs.models import Run, RunGroup
from rl_core.config.files import ConfigError, apply_overrides

# The most runs one sweep may hold (grid points x seeds): a typo in a grid must not queue thousands.
MAX_SWEEP_RUNS = 64
MAX_SEEDS = 32


class InvalidSweep(services.InvalidRunConfig):
    """A sweep refused before anything was stored; `errors` maps `grid.<key>`, `seeds`, `name` or a
    run's dotted config field (prefixed by its point) to messages."""


def seed_list(seeds: int | list[int]) -> list[int]:
    """`3` → [0, 1, 2]; a list is taken as given (duplicates dropped, order kept)."""
    if isinstance(seeds, bool):
        raise InvalidSweep({"seeds": ["a count (1..32) or a list of seeds, not true/false"]})
    if isinstance(seeds, int):
        if not 1 <= seeds <= MAX_SEEDS:
            raise InvalidSweep({"seeds": [f"a count between 1 and {MAX_SEEDS}, got {seeds}"]})
        return list(range(seeds))
    if not isinstance(seeds, list) or not seeds:
        raise InvalidSweep({"seeds": ["a count (1..32) or a non-empty list of seeds"]})
    if any(isinstance(seed, bool) or not isinstance(seed, int) or seed < 0 for seed in seeds):
        raise InvalidSweep({"seeds": ["each seed is a whole number >= 0"]})
    unique = list(dict.fromkeys(seeds))
    if len(unique) > MAX_SEEDS:
        raise InvalidSweep({"seeds": [f"at most {MAX_SEEDS} seeds"]})
    return unique


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the order the keys and values were given."""
    errors: dict[str, list[str]] = {}
    for key, values in grid.items():
        if not key or any(not part for part in key.split(".")):
            errors.setdefault(f"grid.{key}", []).append("a dotted config key, e.g. trainer.lr")
        elif key == "seed":
            errors.setdefault("grid.seed", []).append("seeds are given by `seeds`, not the grid")
        elif not isinstance(values, list) or not values:
            errors.setdefault(f"grid.{key}", []).append("a non-empty list of values")
    if errors:
        raise InvalidSweep(errors)
    keys = list(grid)
    return [dict(zip(keys, combination)) for combination in itertools.product(*(grid[key] for key in keys))]


def point_label(point: dict[str, Any]) -> str:
    """`{"trainer.lr": 0.0003, "seed": 1}` → `lr=0.0003 seed=1` (the last part of each key)."""
    return " ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in point.items())


def expand_sweep(base_config: dict[str, Any], grid: dict[str, list[Any]], seeds: list[int]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(point, raw config) of every run of the sweep: grid points in order, each with every seed."""
    runs = []
    for point in grid_points(grid):
        for seed in seeds:
            config = copy.deepcopy(base_config)
            # JSON text is YAML: the value reaches the config with the type it was sent with.
            try:
                apply_overrides(config, [f"{key}={json.dumps(value)}" for key, value in point.items()])
            except ConfigError as exc:
                raise InvalidSweep({f"grid.{next(iter(point))}": [str(exc)]}) from exc
            config["seed"] = seed
            runs.append(({**point, "seed": seed}, config))
    return runs


def create_sweep(owner: AbstractBaseUser, name: str, base_config: Any, grid: Any, seeds: int | list[int]) -> RunGroup:
    """Validate every run of the sweep, then store the group and queue its runs in one transaction
    (InvalidSweep / services.RunLimitExceeded otherwise, nothing stored)."""
    if not isinstance(base_config, dict):
        raise InvalidSweep({"config": ["must be a mapping of config sections"]})
    if not isinstance(grid, dict):
        raise InvalidSweep({"grid": ["a mapping {dotted key: [values]}"]})
    name = (name or "").strip() or str(base_config.get("name") or "sweep")
    if len(name) > 100:
        # Room for each run's point in its name (runs' names are at most 120 characters).
        raise InvalidSweep({"name": ["at most 100 characters"]})
    seed_values = seed_list(seeds)
    planned = expand_sweep(base_config, grid, seed_values)
    if len(planned) > MAX_SWEEP_RUNS:
        raise InvalidSweep({"grid": [f"{len(planned)} runs (grid points x seeds); at most {MAX_SWEEP_RUNS} per sweep"]})
    checked = []
    for point, config in planned:
        run_name = f"{name} {point_label(point)}"[:120]
        try:
            validated = services.validate_run_config({**config, "name": run_name})
            services.check_run_for_owner(owner, validated)
        except services.InvalidRunConfig as exc:
            # The first refused point names itself: every point shares the base, so its errors are the sweep's.
            raise InvalidSweep({field: [f"{message} (run {point_label(point)})" for message in messages] for field, messages in exc.errors.items()}) from exc
        checked.append((point, run_name, config))
    with transaction.atomic():
        # The owner's row locked, as create_run does, so two sweeps at once cannot both pass the count.
        get_user_model().objects.select_for_update().filter(pk=owner.pk).first()
        room = _free_slots(owner)
        group = RunGroup.objects.create(owner=owner, name=name, base_config=base_config, grid=grid, seeds=seed_values,
                                        waiting=[{"point": point, "name": run_name, "config": config} for point, run_name, config in checked[room:]])
        for point, run_name, config in checked[:room]:
            _queue(owner, group, point, run_name, config)
    return group


def _free_slots(owner: AbstractBaseUser) -> int:
    limit = settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER
    return MAX_SWEEP_RUNS if limit <= 0 else max(0, limit - run_limits.active_run_count(owner))


def _queue(owner: AbstractBaseUser, group: RunGroup, point: dict[str, Any], run_name: str, config: dict[str, Any]) -> Run:
    run = services.create_run(owner, run_name, config)
    Run.objects.filter(pk=run.pk).update(group=group, group_point=point)
    return run


def queue_waiting(owner_id: int) -> list[int]:
    """Queue the owner's waiting sweep runs (oldest sweep first, grid order) into the slots free
    under the active-run limit; the ids of the runs queued. Called after any of their runs ends."""
    owner = get_user_model().objects.filter(pk=owner_id).first()
    if owner is None or not RunGroup.objects.filter(owner_id=owner_id).exclude(waiting=[]).exists():
        return []  # the common case (no sweep waiting): one indexed read
    queued: list[int] = []
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=owner_id).first()
        room = _free_slots(owner)
        for group in RunGroup.objects.select_for_update().filter(owner_id=owner_id).exclude(waiting=[]).order_by("created_at", "id"):
            while group.waiting and room > 0:
                item = group.waiting.pop(0)
                try:
                    queued.append(_queue(owner, group, item["point"], item["name"], item["config"]).pk)
                    room -= 1
                except services.InvalidRunConfig as exc:
                    group.refused.append({"point": item["point"], "name": item["name"], "error": str(exc)[:2000]})
            group.save(update_fields=["waiting", "refused"])
            if room <= 0:
                break
    return queued
