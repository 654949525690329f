"""A cluster run's start-up imports: the launcher's Ray side and every node's Ray actor import
only what they use, because each import is paid before any role starts (bench/multinode.py's
`startup_two_nodes_over_one`): torch alone took ~0.9 s in the launcher and again in every actor's
fresh Ray worker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

REPO_ROOT = Path(__file__).resolve().parents[2]


def modules_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_the_launchers_ray_side_does_not_import_torch() -> None:
    loaded = modules_after_import("rl_core.cluster.ray_placement")
    assert "ray" in loaded
    assert "torch" not in loaded and "rl_core.weights.sync" not in loaded


def test_the_nodes_ray_actor_imports_neither_torch_nor_the_run_config() -> None:
    loaded = modules_after_import("rl_core.cluster.role_actor")
    assert "ray" in loaded
    assert not {"torch", "pydantic", "rl_core.config.run_config", "rl_core.weights.sync"} & loaded


def test_the_advertised_address_variable_is_the_one_the_weight_group_reads() -> None:
    from rl_core.rundir import layout as run_dir
    from rl_core.weights import sync as weight_sync

    assert weight_sync.ADVERTISED_ADDRESS_ENV is run_dir.ADVERTISED_ADDRESS_ENV == "INFLIGHT_ADVERTISED_ADDRESS"
