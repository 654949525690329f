"""A whole run on the tiny model: real server, trainer, actor and in-flight weight
broadcasts as child processes of `python -m rl_core run`; then `--resume`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.metrics_file import read_metrics
from rl_core.launch.provenance import read_provenance
from rl_core.rundir.stream import FileStreamReader

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def run(config: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=400)


def test_short_run_then_resume(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "name": "e2e",
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 3, "checkpoint_every": 2, "lr": 1e-4},
        "eval": {"heldout_every_n_steps": 2, "heldout_k": 1},
    }))
    out = tmp_path / "run"
    result = run(config, out)
    assert result.returncode == 0, result.stdout + result.stderr
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "succeeded" and status["error"] is None
    assert yaml.safe_load((out / "config.yaml").read_text())["trainer"]["max_steps"] == 3

    records = read_metrics(out / "metrics.jsonl")
    keys = set().union(*records)
    for key in ("train/loss", "train/grad_norm", "train/entropy", "train/ess", "train/samples_per_s",
                "train/tokens_per_s", "policy_lag/mean", "policy_lag/max", "weights/version",
                "weights/update_pause_s", "reward/mean", "success/mean", "rollout/tokens_per_s",
                "rollout/in_flight", "rollout/versions_per_sequence/max", "success/heldout", "system/cpu_util"):
        assert key in keys, key
    for role in ("trainer", "server0", "actor"):  # per process, not only per node (system_metrics.py)
        assert f"system/proc/{role}/cpu_percent" in keys and f"system/proc/{role}/rss_mb" in keys, role
    launches = read_provenance(out)  # what ran it: provenance.jsonl, one line per launch
    assert len(launches) == 1 and launches[0].command[-5:] == ["run", str(config), "--out", str(out), "--quiet"]
    versions = {r["weights/version"] for r in records if "weights/version" in r}
    assert {1.0, 2.0, 3.0} <= versions  # every step was broadcast
    assert max(r["policy_lag/max"] for r in records if "policy_lag/max" in r) <= 1  # max_lag holds per token
    assert (out / "checkpoints" / "step_000002" / "model.safetensors").is_file()
    assert (out / "checkpoints" / "latest").resolve().name == "step_000003"
    for name in ("server0", "trainer", "actor"):
        assert (out / "logs" / f"{name}.log").is_file()
    # The servers really took the new weights: rollouts carry tokens of versions > 0.
    samples = FileStreamReader(out).read(10_000, 0.1)
    assert max(v for s in samples for v in s.token_versions) >= 1

    # A second launch without --resume refuses to mix two runs in one directory.
    again = run(config, out)
    assert again.returncode == 2 and "--resume" in again.stderr

    # Resume to 5 steps: continues at version 3 from the checkpointed stream position.
    result = run(config, out, "--resume", "--set", "trainer.max_steps=5")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
    records = read_metrics(out / "metrics.jsonl")
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == [1, 2, 3, 4, 5]  # nothing trained twice, no step skipped
    consumed = [r["train/samples_consumed"] for r in records if "train/loss" in r]
    assert consumed == sorted(consumed) and consumed[-1] >= 5 * 8
    assert (out / "checkpoints" / "latest").resolve().name == "step_000005"
    assert [launch.resume for launch in read_provenance(out)] == [False, True]


def test_run_over_an_embedded_redis_stream(tiny_model: Path, tmp_path: Path) -> None:
    """stream.kind=redis with the run's own redis-server (started and stopped by the launcher)."""
    import psutil

    config = tmp_path / "redis.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 2},
        "stream": {"kind": "redis", "redis_embedded": True},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
    }))
    out = tmp_path / "run"
    result = run(config, out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r] == [1, 2]
    assert not (out / "stream").exists()  # the samples went through Redis
    assert (out / "redis" / "appendonly.aof").exists() or (out / "redis" / "appendonlydir").exists()
    socket_path = str(out / "redis" / "redis.sock")
    assert not [p for p in psutil.process_iter(["cmdline"]) if socket_path in " ".join(p.info["cmdline"] or [])]


def test_run_with_every_acceleration_on_reports_speculation_and_scheduling(tiny_model: Path, tmp_path: Path) -> None:
    """HistoSpec (with the run's own settings), HistoPipe on two servers and tail batching
    together: the run succeeds and the run page gets spec/* and sched/* metrics."""
    config = tmp_path / "accelerated.yaml"
    config.write_text(yaml.safe_dump({
        "name": "e2e-accelerated",
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4, "train_size": 8},  # few prompts: later epochs draft from history
        "sampling": {"max_new_tokens": 40},
        "inference": {"num_servers": 2},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 6, "lr": 1e-4},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
        "accelerations": {"histospec": {"enabled": True, "min_match": 3},
                          "histopipe": {"enabled": True}, "tail_batching": {"enabled": True}},
    }))
    out = tmp_path / "run"
    result = run(config, out)
    assert result.returncode == 0, result.stdout + result.stderr + (out / "logs" / "actor.log").read_text()
    keys = set().union(*read_metrics(out / "metrics.jsonl"))
    for key in ("spec/acceptance_rate", "spec/drafted_tokens", "sched/long_tail_queue", "sched/aborted"):
        assert key in keys, key
