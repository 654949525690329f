"""A run config from its files and forms: the run defaults, loading YAML with overrides, errors
that name the field (`python -m rl_core validate` is the launcher's preflight: rl_core/launch/preflight.py).

`rl_core/config/run_config.py` is the schema (`RunConfig` and its sections); this is everything that turns
text a user wrote into one, the same for the CLI, the launcher, the worker and the platform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rl_core.config.run_config import RunConfig


class ConfigError(ValueError):
    """A config that cannot run; the message names the offending field(s)."""


def format_validation_error(error: ValidationError) -> str:
    """One line per problem, `field.path: message` — what the CLI prints and the form shows."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        lines.append(f"{where}: {item['msg']}")
    return "\n".join(lines)


def field_errors(error: ValidationError) -> dict[str, list[str]]:
    """Errors keyed by dotted field path, for showing them next to form fields."""
    out: dict[str, list[str]] = {}
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        out.setdefault(where, []).append(item["msg"])
    return out


# The defaults of every run, one set from every entry point: the create form and its YAML tab,
# the API (with `inflight submit` and the docs page's "Try it out"), and the engine's own
# `python -m rl_core run|validate` (`load_config`). A value here applies where a config is silent
# and stands over the schema's field default, which stays the neutral value for code that builds
# a RunConfig itself (unit tests, benches, fixtures). They are the learning dynamics under which
# a policy does not drift or collapse in our runs (bench/RESULTS.md, issues 26 and 33): a run
# from the API with the schema's values (max lag 4, constant LR, 32 samples per step) fell from
# 0.60 to 0.45 held-out where the same from the form held 0.66. Machine-specific settings (batch
# sizes, threads, wall-time budget, the model) are not defaults; the demo's YAML sets them.
RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "actor": {
        # Tokens are trained at most 2 versions after they were sampled (lag 4 with a higher LR
        # collapsed the tiny policy).
        "max_lag": 2,
        # Reward minus the group mean, divided by the group std: a rare success in a hard group
        # weighs as much as a rare failure in an easy one.
        "advantage": "group_mean_std",
    },
    "trainer": {
        # A fresh AdamW: the first sign-like Adam steps at full LR cost a few points.
        "warmup_steps": 20,
        # Then cosine decay to 0 at max_steps. At a constant LR the policy drifted with the mix of
        # the last few batches (held-out 0.68 at step 40 -> 0.54 at step 60 for every seed) and
        # ended 0.57-0.67; decayed, it ends within noise of its best.
        "schedule": "cosine",
        # 8 groups of 8 per step: less gradient noise than 32, still ~1 step per second on a CPU.
        "samples_per_step": 64,
    },
}


def with_run_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """`data` over RUN_DEFAULTS: what the config gives wins, a field it leaves out takes the run
    default (a section given as something other than a mapping is left for validation to name)."""
    merged = dict(data)
    for section, values in RUN_DEFAULTS.items():
        given = merged.get(section, {})
        if isinstance(given, dict):
            merged[section] = {**values, **given}
    return merged


def run_default_values() -> dict[str, Any]:
    """Every field of a run whose config says nothing: the schema's defaults under RUN_DEFAULTS."""
    return RunConfig.model_validate(RUN_DEFAULTS).model_dump(mode="json")


def parse_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a raw config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(raw)
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return parse_config(with_run_defaults(apply_overrides(data, overrides or [])))


def load_config_or_exit(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """`load_config` for a command line (`validate`, `run`): an invalid config prints why and
    exits 2, the exit status the platform and the tests read as "refused before start"."""
    import sys

    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        print(f"invalid config:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None


def config_to_yaml(config: RunConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
