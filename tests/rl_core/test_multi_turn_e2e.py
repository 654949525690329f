"""A whole run with `env.name: math_python_tool` (issue 34): `python -m rl_core run` through the
launcher on the tiny model, a few steps with in-flight updates.

The untrained-for-tools tiny model (warm-started on answers without code) writes no ```python
block in practice, so this run shows the path end to end (config → env → actor's trajectories →
stream → trainer → evals) with model-only trajectories; tool turns with mask 0 are checked here
wherever one occurs, and always in test_multi_turn.py against a scripted server that answers with
a code block (the Python really runs in the sandbox there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rl_core.common import metric_names as mn
from rl_core.rundir.stream import FileStreamReader
from tests.metrics_file import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_a_tool_env_run_finishes_with_trajectories_turns_and_tool_metrics(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "tools.yaml"
    config.write_text(yaml.safe_dump({
        "name": "e2e-tools",
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 32},
        "env": {"name": "math_python_tool", "max_turns": 2, "tool_wall_s": 2.0},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 3, "checkpoint_every": 0, "lr": 1e-4},
        "eval": {"heldout_every_n_steps": 2, "heldout_k": 1},
    }))
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"],
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"

    keys = set().union(*read_metrics(out / "metrics.jsonl"))
    for key in (mn.TOOL_CALLS_PER_SAMPLE, mn.TOOL_CALL_SHARE, mn.TOOL_WAIT_SHARE, mn.ENV_TURNS_PER_SAMPLE, "train/loss"):
        assert key in keys, key
    samples = FileStreamReader(out).read(10_000, 0.1)
    assert len(samples) >= 3 * 8
    for sample in samples:
        assert sample.metadata["env"] == "math_python_tool" and sample.completion_mask is not None
        assert len(sample.completion_mask) == len(sample.completion_token_ids)
        turns = sample.metadata["turns"]
        assert turns[0]["start"] == 0 and turns[-1]["end"] == len(sample.completion_token_ids)
        assert sample.metadata["tool_calls"] == sum(turn["kind"] == "tool" for turn in turns)
        for turn in turns:  # a tool turn is context only: mask 0, version -1; a model turn is trained
            span = range(turn["start"], turn["end"])
            expected = 0 if turn["kind"] == "tool" else 1
            assert all(sample.completion_mask[i] == expected for i in span)
            assert all((sample.token_versions[i] == -1) == (turn["kind"] == "tool") for i in span)
    # The held-out evaluation ran through the same env: its per-problem lines say whether a tool was used.
    per_problem = sorted((out / "eval").glob("step_*_heldout.jsonl"))
    assert per_problem
    rows = [json.loads(line) for line in per_problem[-1].read_text().splitlines()]
    assert rows and all(isinstance(row["used_tool"], bool) for row in rows)
