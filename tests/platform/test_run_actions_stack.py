"""Resume and fork on the real stack: the real engine on the tiny model under real Celery workers,
PostgreSQL and Redis. The trainer of a run on worker A is SIGKILLed mid-way; A goes away; the
run is resumed from its page and worker B (sharing only the run storage, INFLIGHT_RUNS_DIR)
finishes it: every step 1..max_steps is charted once and every stream sample is trained at
most once (counted from trainer_shards.jsonl). Then a fork from the final checkpoint evaluates
like the parent did at that step, and a resume whose checkpoint was deleted fails naming it."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from django.test import Client

from inflight.runs import services
from inflight.runs.models import MetricPoint, Run, RunStatus
from rl_core.rundir.resume import is_superseded, read_resumes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAX_STEPS = 12


def config(tiny_model: Path, name: str) -> dict:
    return {
        "name": name,
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 8},
        "sampling": {"max_new_tokens": 16},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": MAX_STEPS, "lr": 1e-4, "checkpoint_every": 3},
        # Greedy held-out eval: the same weights give the same score (the fork check below).
        "eval": {"heldout_every_n_steps": 6, "heldout_k": 1, "heldout_temperature": 0.0},
    }


def trainer_pid(run_dir: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"rl_core trainer --run-dir {run_dir}" in cmdline:
            return int(proc.name)
    return None


def trained_steps(run_dir: Path) -> int:
    try:
        return sum(1 for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in line)
    except FileNotFoundError:
        return 0


def test_sigkilled_run_resumed_from_its_page_on_another_worker_then_forked(start_worker, owner, owner_api, tiny_model, wait) -> None:
    worker_a = start_worker()
    response = owner_api.post("/api/runs/", json.dumps({"name": "resumable", "config": config(tiny_model, "resumable")}), content_type="application/json")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    wait(lambda: Run.objects.get(pk=run_id).status == RunStatus.RUNNING, timeout=300, interval=0.5, message="running")
    run_dir = Path(Run.objects.get(pk=run_id).run_dir)
    wait(lambda: trained_steps(run_dir) >= 4, timeout=300, interval=0.05, message="4 trainer steps")
    pid = wait(lambda: trainer_pid(str(run_dir)), timeout=10, message="the trainer's pid")
    os.kill(pid, signal.SIGKILL)  # mid-run, between checkpoints most of the time
    killed = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=120, interval=0.5, message="the run to fail")
    assert killed.status == RunStatus.FAILED and "trainer" in killed.error, killed.error
    # Counted from the shard file, not the chart: a step's shard line is written right after it
    # trains and its metrics line only after the broadcast, so a kill in between leaves one more.
    steps_before = len((run_dir / "trainer_shards.jsonl").read_text().splitlines())
    worker_a.stop()
    worker_b = start_worker()

    page = Client()
    page.force_login(owner)
    assert page.post(f"/runs/{run_id}/resume/").status_code == 302
    done = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=400, interval=1, message="the resumed run to end")
    assert done.status == RunStatus.SUCCEEDED, (done.error, worker_b.log()[-3000:])
    assert done.worker_name == worker_b.name and done.resume_count == 1

    # The chart: every step once, although the dead attempt logged some steps the resume redid.
    steps = sorted(MetricPoint.objects.filter(run_id=run_id, name="train/loss").values_list("step", flat=True))
    assert steps == list(range(1, MAX_STEPS + 1))
    resumes = read_resumes(run_dir)
    assert len(resumes) == 1 and resumes[0].step % 3 == 0 and 3 <= resumes[0].step < MAX_STEPS
    rewound = steps_before - resumes[0].step  # steps trained after the checkpoint, then lost with the trainer
    print(f"killed after step {steps_before}, resumed from checkpoint {resumes[0].step}: {rewound} step(s) redone")

    # Every stream sample trained at most once, none written-and-untrained lost: the surviving
    # history's batches are disjoint and are exactly the first `consumed` stream samples
    # (less any dropped as too stale).
    shards = [json.loads(line) for line in (run_dir / "trainer_shards.jsonl").read_text().splitlines()]
    kept = [s for n, s in enumerate(shards) if not is_superseded(resumes, "trainer_shards.jsonl", n, s["step"])]
    assert sorted(s["step"] for s in kept) == list(range(1, MAX_STEPS + 1))
    assert len(shards) - len(kept) == rewound
    trained = [sample_id for s in kept for sample_id in s["sample_ids"]]
    assert len(trained) == MAX_STEPS * 8 and len(set(trained)) == len(trained)
    state = json.loads((run_dir / "checkpoints" / "latest" / "trainer_state.json").read_text())
    stream = [json.loads(line)["sample_id"] for line in (run_dir / "stream" / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    assert len(set(stream)) == len(stream)
    consumed = stream[: state["consumed"]]
    assert set(trained) <= set(consumed) and len(set(consumed) - set(trained)) == state["dropped_stale"]
    print(f"stream {len(stream)} samples, consumed {state['consumed']}, trained {len(trained)} once each, dropped stale {state['dropped_stale']}")

    # A fork from the final checkpoint (written by worker B) starts from those weights: its
    # step-0 held-out score is the parent's at step 12 (greedy; batching may move a token).
    response = owner_api.post(f"/api/runs/{run_id}/clone/", json.dumps({"name": "fork", "from_step": MAX_STEPS, "config": {"trainer": {"max_steps": 2, "checkpoint_every": 0}}}), content_type="application/json")
    assert response.status_code == 201, response.content
    fork = response.json()
    assert fork["parent"] == run_id and fork["parent_step"] == MAX_STEPS
    assert fork["config"]["model"]["path"].endswith(f"{run_id}/checkpoints/step_{MAX_STEPS:06d}")
    fork_done = wait(lambda: (r := Run.objects.get(pk=fork["id"])).is_terminal and r, timeout=300, interval=1, message="the fork to end")
    assert fork_done.status == RunStatus.SUCCEEDED, fork_done.error
    parent_score = MetricPoint.objects.filter(run_id=run_id, name="success/heldout", step=MAX_STEPS).order_by("-line").values_list("value", flat=True).first()
    fork_score = MetricPoint.objects.filter(run_id=fork["id"], name="success/heldout", step=0).values_list("value", flat=True).first()
    print(f"held-out success: parent at step {MAX_STEPS} {parent_score}, fork at step 0 {fork_score}")
    assert parent_score is not None and fork_score is not None and abs(parent_score - fork_score) <= 0.125

    # A resume whose checkpoint went away between the request and the worker fails loudly,
    # naming it, instead of starting over from step 0.
    fork_dir = Path(fork_done.run_dir)
    latest = (fork_dir / "checkpoints" / "latest").resolve()
    shutil.rmtree(latest)
    Run.objects.filter(pk=fork["id"]).update(status=RunStatus.QUEUED, resume_count=1, finished_at=None)
    services.dispatch_run(fork["id"], "cpu")
    refused = wait(lambda: (r := Run.objects.get(pk=fork["id"])).is_terminal and r, timeout=120, interval=0.5, message="the refused resume to end")
    assert refused.status == RunStatus.FAILED and f"checkpoints/{latest.name}" in refused.error and "missing" in refused.error, refused.error
    assert MetricPoint.objects.filter(run_id=fork["id"], name="train/loss").count() == 2  # nothing started over
