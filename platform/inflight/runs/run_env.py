"""Which environment a run's rollouts come from, read from its stored config: the one place the
pages (leaderboard, compare, the run page) and the API learn it, so a tool-using run and a plain
math run are told apart the same way everywhere."""

from __future__ import annotations

from typing import Any, Mapping

from rl_core.config.run_config import RunConfig

# A config from before the `env` section ran the only environment there was: single-turn math.
SINGLE_TURN_ENV = "math"


def default_env_name() -> str:
    """The env a config without `env.name` runs: RunConfig's default once it has the section."""
    field = RunConfig.model_fields.get("env")
    if field is None:
        return SINGLE_TURN_ENV
    default = field.get_default(call_default_factory=True)
    return str(getattr(default, "name", None) or SINGLE_TURN_ENV)


def run_env_name(config: Mapping[str, Any] | None) -> str:
    """`env.name` of a stored run config (`math`, `math_python_tool`, `custom`), else the default."""
    env = (config or {}).get("env")
    name = env.get("name") if isinstance(env, Mapping) else None
    return str(name) if name else default_env_name()

