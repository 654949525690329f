"""A real Celery worker runs runs end to end: dispatch → supervise → ingest → final status.

The engine here is the stand-in script of conftest.py (ENGINE) that writes the run directory exactly as
`python -m rl_core run` documents it (status.json, metrics.jsonl, evals.jsonl + per-problem
file) and can fail, hang, ignore SIGTERM and spawn a grandchild on demand: that makes the
platform's side (worker, supervisor, services, Channels) testable without the cost and
nondeterminism of training. `test_worker_real_engine.py` runs the real engine.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from channels.layers import get_channel_layer

from inflight.live.broadcast import batch_points
from inflight.runs import services
from inflight.runs.models import EvalProblemResult, EvalScore, MetricPoint, Run, RunStatus, RunSummary
from layer_loop import LayerLoop  # tests/platform is on sys.path

@pytest.fixture
def worker(start_worker, engine_command):
    return start_worker(extra_env={"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_CANCEL_TIMEOUT_S": "2"})


def run_with(owner, mode: str, steps: int = 30) -> Run:
    return services.create_run(owner, mode, {"name": mode, "trainer": {"max_steps": steps}})


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def final(run: Run, wait, timeout: float = 90) -> Run:
    return wait(
        lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r,
        timeout=timeout,
        message=f"run {run.pk} to end",
    )


def test_run_succeeds_with_all_metrics_evals_and_live_pushes(worker, owner, wait) -> None:
    layer = get_channel_layer()
    layer_loop = LayerLoop()  # the pub/sub layer's subscriptions live on one loop
    channel = layer_loop.run(layer.new_channel())
    run = run_with(owner, "succeed", steps=40)
    layer_loop.run(layer.group_add(f"run-{run.pk}", channel))
    done = final(run, wait)
    assert done.status == RunStatus.SUCCEEDED, (done.error, worker.log()[-3000:])
    assert done.worker_name == worker.name and done.started_at and done.finished_at
    assert MetricPoint.objects.filter(run=run, name="train/loss").count() == 40
    assert MetricPoint.objects.filter(run=run).values("line").distinct().count() == 40
    score = EvalScore.objects.get(run=run)
    assert score.benchmark == "math500" and score.mean_at_k == 1.0
    assert EvalProblemResult.objects.get(eval=score).extracted == ["4"]
    messages = []
    while True:
        try:
            messages.append(layer_loop.run(_receive(layer, channel)))
        except TimeoutError:
            break
    layer_loop.close()
    batches = [m for m in messages if m["type"] == "metrics.batch"]
    statuses = [m["status"] for m in messages if m["type"] == "run.status"]
    assert sum(len(batch_points(b)) for b in batches) == 80  # 40 lines x 2 metrics, each pushed once
    assert [b["seq"] for b in batches] == sorted(b["seq"] for b in batches)
    assert statuses[-1] == "succeeded" and "running" in statuses
    assert any(m["type"] == "eval.score" for m in messages)
    # The ended run's leaderboard summary is written by its worker, not left to the first read.
    summary = wait(lambda: RunSummary.objects.filter(run=run).first(), timeout=30, interval=0.2, message="the run's summary")
    assert summary.metrics_seq == Run.objects.get(pk=run.pk).metrics_seq


async def _receive(layer, channel):
    import asyncio

    return await asyncio.wait_for(layer.receive(channel), timeout=2)


def test_failed_run_records_the_engine_error(worker, owner, wait) -> None:
    done = final(run_with(owner, "fail", steps=3), wait)
    assert done.status == RunStatus.FAILED and "CUDA out of memory" in done.error


def test_crash_without_status_records_exit_code(worker, owner, wait) -> None:
    done = final(run_with(owner, "crash", steps=3), wait)
    assert done.status == RunStatus.FAILED and "exited with code 7" in done.error


@pytest.mark.parametrize("mode", ["hang", "hang-ignore-term"])
def test_cancel_stops_the_whole_process_group(worker, owner, mode, wait) -> None:
    run = run_with(owner, mode, steps=5)
    wait(lambda: Run.objects.get(pk=run.pk).status == RunStatus.RUNNING, timeout=90, message="running")
    grandchild_file = Path(Run.objects.get(pk=run.pk).run_dir) / "grandchild.pid"
    grandchild = int(wait(lambda: grandchild_file.exists() and grandchild_file.read_text(), message="grandchild"))
    assert pid_alive(grandchild)
    services.request_cancel(Run.objects.get(pk=run.pk), owner)
    done = final(run, wait, timeout=60)
    assert done.status == RunStatus.CANCELLED, done.error
    wait(lambda: not pid_alive(grandchild), timeout=10, message="grandchild to be gone")


def test_killed_worker_loses_its_runs_and_its_engine(start_worker, engine_command, owner, wait) -> None:
    env = {"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_WORKER_LOST_AFTER_S": "3"}
    doomed = start_worker(extra_env=env)
    run = run_with(owner, "hang", steps=3)
    wait(lambda: Run.objects.get(pk=run.pk).status == RunStatus.RUNNING, timeout=90, message="running")
    run_dir = Path(Run.objects.get(pk=run.pk).run_dir)
    engine_pid = int(__import__("json").loads((run_dir / "status.json").read_text())["pid"])
    doomed.process.send_signal(signal.SIGKILL)  # the worker only, not its process group
    doomed.process.wait(10)
    # The engine learns of its supervisor's death (PR_SET_PDEATHSIG) and is not left running.
    wait(lambda: not pid_alive(engine_pid), timeout=20, message="engine to stop after its worker died")
    # A surviving worker's heartbeat notices the silence and marks the run lost.
    start_worker(queues="gpu", extra_env=env)
    lost = wait(lambda: (r := Run.objects.get(pk=run.pk)).status == RunStatus.LOST and r, timeout=60, message="lost")
    assert doomed.name in lost.error
