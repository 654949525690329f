"""`python -m rl_core run` as a real process: bad inputs refused before anything
starts, a server killed mid-run, SIGTERM, and a SIGKILLed launcher (no orphans)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from rl_core.metrics import read_metrics


def write_config(path: Path, model: Path, **overrides: object) -> Path:
    data: dict = {
        "name": "launcher-test",
        "model": {"path": str(model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 3},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_core", "run", *args], capture_output=True, text=True, timeout=timeout)


def start_run(config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def status(out: Path) -> dict:
    try:
        return json.loads((out / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def trained_steps(out: Path) -> int:
    if not (out / "metrics.jsonl").exists():
        return 0
    return sum("train/loss" in record for record in read_metrics(out / "metrics.jsonl"))


def children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def assert_all_gone(processes: list[psutil.Process], timeout_s: float = 30) -> None:
    gone, alive = psutil.wait_procs(processes, timeout=timeout_s)
    assert not alive, f"orphans left alive: {[(p.pid, p.cmdline()) for p in alive]}"


def test_bad_config_exits_2_naming_the_field(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"samples_per_step": 0})
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "trainer.samples_per_step" in result.stderr
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    result = run_cli(str(config), "--out", str(tmp_path / "run"), "--set", "trainer.samples_per_step=8", "--set", "actor.typo=1")
    assert result.returncode == 2 and "actor.typo" in result.stderr


def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tmp_path / "no-such-model")
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "model.path" in result.stderr and "no-such-model" in result.stderr and "does not exist" in result.stderr


def test_dataset_row_without_answer_is_refused_before_start(tiny_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = [{"id": f"p{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(10)]
    del rows[3]["answer"]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = write_config(tmp_path / "c.yaml", tiny_model, task={"kind": "math_jsonl", "train_path": str(data), "heldout_size": 2})
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "train.jsonl" in result.stderr and "answer" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_killed_mid_run_fails_naming_it_and_keeps_metrics(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: trained_steps(out) >= 1, 180, "a first training step")
        server = next(p for p in children_of(launcher.pid) if "serve" in p.cmdline())
        others = [p for p in children_of(launcher.pid) if p.pid != server.pid]
        server.send_signal(signal.SIGKILL)
        assert launcher.wait(60) == 1
    finally:
        if launcher.poll() is None:
            launcher.kill()
    final = status(out)
    assert final["state"] == "failed"
    assert "server0" in final["error"] and "SIGKILL" in final["error"]
    assert trained_steps(out) >= 1  # metrics so far are kept
    assert_all_gone(others)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_cancels_and_leaves_no_child(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: status(out).get("state") == "running", 180, "state running")
        children = children_of(launcher.pid)
        assert {"serve", "trainer", "actor"} <= {word for p in children for word in p.cmdline()}
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 130
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert status(out)["state"] == "cancelled" and status(out)["error"] is None
    assert_all_gone(children)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkilled_launcher_takes_its_children_along(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: status(out).get("state") == "running", 180, "state running")
        children = children_of(launcher.pid)
        assert len(children) >= 3
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert_all_gone(children)
