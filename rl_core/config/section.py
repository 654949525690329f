"""The base of every section of the run config (`rl_core/config/run_config.py`, `rl_core/config/cluster.py`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigSection(BaseModel):
    # extra="forbid": a typo in a key is an error that names the key, not a silent default.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
