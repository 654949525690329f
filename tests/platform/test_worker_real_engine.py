"""The real engine under a real worker: `python -m rl_core run` on the tiny model, submitted
through the API, tailed into PostgreSQL, and cancelled with no process left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inflight.runs.models import EvalScore, MetricPoint, Run, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def short_config(tiny_model: Path, name: str, max_steps: int) -> dict:
    return {
        "name": name,
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 16},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": max_steps, "lr": 1e-4},
        "eval": {"heldout_every_n_steps": 1, "heldout_k": 1},
    }


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if text in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


def test_api_submitted_tiny_run_succeeds_with_its_metrics(start_worker, owner_api, tiny_model, wait) -> None:
    worker = start_worker()
    response = owner_api.post("/api/runs/", json.dumps({"name": "real", "config": short_config(tiny_model, "real", 2)}), content_type="application/json")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    done = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=500, interval=1, message="the run to end")
    assert done.status == RunStatus.SUCCEEDED, (done.error, worker.log()[-3000:])
    steps = sorted(MetricPoint.objects.filter(run_id=run_id, name="train/loss").values_list("step", flat=True))
    assert steps == [1, 2]
    assert MetricPoint.objects.filter(run_id=run_id, name="success/heldout").exists()
    # Everything the engine logged is in the database, once.
    lines = (Path(done.run_dir) / "metrics.jsonl").read_text().splitlines()
    assert MetricPoint.objects.filter(run_id=run_id).values("line").distinct().count() == len(lines)
    metrics = owner_api.get(f"/api/runs/{run_id}/metrics/?since_seq=0&names=train/loss").json()
    assert [p[1] for p in metrics["points"]] == [1, 2]
    evals_file = Path(done.run_dir) / "evals.jsonl"
    eval_lines = evals_file.read_text().splitlines() if evals_file.exists() else []
    assert EvalScore.objects.filter(run_id=run_id).count() == len(eval_lines)


def test_cancelling_a_real_run_leaves_no_process(start_worker, owner_api, tiny_model, wait) -> None:
    start_worker()
    response = owner_api.post("/api/runs/", json.dumps({"name": "long", "config": short_config(tiny_model, "long", 500)}), content_type="application/json")
    run_id = response.json()["id"]
    wait(lambda: Run.objects.get(pk=run_id).status == RunStatus.RUNNING, timeout=300, interval=0.5, message="running")
    run_dir = Run.objects.get(pk=run_id).run_dir
    assert processes_mentioning(run_dir)  # the launcher and its children are up
    assert owner_api.post(f"/api/runs/{run_id}/cancel/").json()["status"] == "cancelling"
    done = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=120, interval=0.5, message="cancelled")
    assert done.status == RunStatus.CANCELLED, done.error
    wait(lambda: not processes_mentioning(run_dir), timeout=30, message="no process of the run left")
