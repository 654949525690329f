"""Fixtures shared by every test area.

`untrained_tiny_model` is the tiny Qwen2-style model with random weights (seconds to
build); `tiny_model` is the warm-started demo model at its default place, built once
and reused (`python -m rl_core bootstrap-tiny` writes the same directory).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Two cores are shared by the servers, the trainer and pytest itself: one
# intra-op thread per process keeps tests from oversubscribing them.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA_DIR = Path(os.environ.get("INFLIGHT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    if not (SHARED_DATA_DIR / "math500" / "test.jsonl").is_file():
        pytest.skip(f"shared data not found at {SHARED_DATA_DIR}")
    return SHARED_DATA_DIR


@pytest.fixture(scope="session")
def untrained_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rl_core.models.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-untrained"), seed=0, warm_start=False)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR
    from rl_core.models.tiny_model import ensure_tiny_model

    return ensure_tiny_model(REPO_ROOT / DEFAULT_TINY_MODEL_DIR)
