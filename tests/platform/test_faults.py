"""Fault injection with real processes and real services: what each fault does to a run.

One scenario per test, every wait bounded. The engine is conftest's stand-in (ENGINE); the
workers, Daphne, Redis and PostgreSQL are real. After each scenario the number of metric points
the API serves equals what the run's metrics.jsonl holds (nothing lost, nothing twice) where
the scenario lets the run's lines be delivered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from inflight.devservices import _running_redis, free_port, start_redis
from inflight.runs import services
from inflight.runs.models import Run, RunStatus

from test_worker_db_outage import TcpRelay  # noqa: E402 - tests/platform is on sys.path (rootdir-relative imports)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

FAST = {"INFLIGHT_HEARTBEAT_INTERVAL_S": "0.5", "INFLIGHT_CANCEL_TIMEOUT_S": "2"}


def run_with(owner, mode: str, steps: int) -> Run:
    return services.create_run(owner, mode, {"name": mode, "trainer": {"max_steps": steps}})


def status_of(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status


def file_points(run: Run) -> int:
    path = Path(Run.objects.get(pk=run.pk).run_dir) / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(len([k for k in record if k not in ("t", "step")]) for record in lines)


def api_points(api, run: Run) -> int:
    body = api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0").json()
    assert not body["truncated"]
    return len(body["points"])


def sigkill(worker) -> None:
    worker.process.send_signal(signal.SIGKILL)  # the worker process only, as the OOM killer would
    worker.process.wait(10)


@pytest.fixture
def daphne(live_database_url: str, transactional_db: None, tmp_path: Path, wait):
    """The web server, whose own sweeper is the only one left once the only worker is dead."""
    port = free_port()
    log_path = tmp_path / "daphne.log"
    env = {**os.environ, "DATABASE_URL": live_database_url, "INFLIGHT_WORKER_LOST_AFTER_S": "3", "INFLIGHT_WEB_SWEEPER": "1", **FAST}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "inflight.asgi:application"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def listening() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)
            return True
        except OSError:
            assert process.poll() is None, log_path.read_text()[-3000:]
            return False

    wait(listening, timeout=60, message="daphne to listen")
    yield log_path
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(20)


def test_sigkilled_only_worker_run_is_lost_within_threshold_and_cancel_ends(daphne, start_worker, engine_command, owner, owner_api, wait) -> None:
    worker = start_worker(extra_env={"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_WORKER_LOST_AFTER_S": "3", **FAST})
    run = run_with(owner, "hang", steps=5)
    wait(lambda: status_of(run) == RunStatus.RUNNING, timeout=60, message="running")
    wait(lambda: api_points(owner_api, run) == 10, timeout=30, message="the points to arrive")
    sigkill(worker)
    killed_at = time.monotonic()
    # No worker is left: the web server's sweeper marks it lost (threshold 3 s + heartbeat + margin).
    lost = wait(lambda: (r := Run.objects.get(pk=run.pk)).status == RunStatus.LOST and r, timeout=15, message="lost")
    assert time.monotonic() - killed_at < 3 + 8
    assert worker.name in lost.error
    # The sweeper logs after its sweep has committed: the line may trail the status by a moment.
    wait(lambda: "lost" in daphne.read_text(), timeout=10, message="the web server's sweeper to log the lost run")
    response = owner_api.post(f"/api/runs/{run.pk}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == RunStatus.CANCELLED
    assert api_points(owner_api, run) == file_points(run) == 10


def test_cancel_of_an_orphaned_run_ends_cancelled_when_its_worker_restarts(start_worker, engine_command, owner, owner_api, wait) -> None:
    env = {"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_WORKER_LOST_AFTER_S": "30", **FAST}
    worker = start_worker(extra_env=env)
    run = run_with(owner, "slow", steps=400)
    wait(lambda: api_points(owner_api, run) >= 10, timeout=60, message="points")
    sigkill(worker)
    # Within the threshold nobody knows the worker is dead yet: the cancel waits in `cancelling`.
    assert owner_api.post(f"/api/runs/{run.pk}/cancel/").json()["status"] == RunStatus.CANCELLING
    start_worker(extra_env=env, name=worker.name)  # the same node name, as `-n demo@%h` restarts
    done = wait(lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r, timeout=30, message="the cancel to end")
    assert done.status == RunStatus.CANCELLED, done.error
    assert api_points(owner_api, run) == file_points(run) > 0  # the lines the dead worker never delivered


def test_restarted_worker_reconciles_its_dead_predecessors_run(start_worker, engine_command, owner, owner_api, wait) -> None:
    env = {"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_WORKER_LOST_AFTER_S": "30", **FAST}
    worker = start_worker(extra_env=env)
    run = run_with(owner, "slow", steps=400)
    wait(lambda: api_points(owner_api, run) >= 10, timeout=60, message="points")
    sigkill(worker)
    restarted = start_worker(extra_env=env, name=worker.name)
    # Not vouched for by the new process under the old name; settled from the run directory
    # long before the 30 s threshold.
    lost = wait(lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r, timeout=20, message="reconciled")
    assert lost.status == RunStatus.LOST and "died" in lost.error, lost.error
    # The worker says so once the run's end is recorded: a moment after the status the wait saw.
    wait(lambda: "reconciled" in restarted.log(), timeout=10, message="the reconcile's log line")
    assert api_points(owner_api, run) == file_points(run) > 0
    assert owner_api.post(f"/api/runs/{run.pk}/cancel/").json()["status"] == RunStatus.CANCELLED


def test_queued_run_survives_a_redis_crash(embedded_services, start_worker, engine_command, owner, owner_api, wait) -> None:
    run = run_with(owner, "succeed", steps=10)  # no worker yet: its message waits in Redis
    time.sleep(1.5)  # the append-only file is fsynced once a second
    pid, port = _running_redis(embedded_services.folder)
    os.kill(pid, signal.SIGKILL)
    wait(lambda: _running_redis(embedded_services.folder) is None, timeout=10, message="redis to die")
    start_redis(embedded_services.folder, port)
    start_worker(extra_env={"INFLIGHT_RL_COMMAND": engine_command, **FAST})
    done = wait(lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r, timeout=60, message="the queued run to run")
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert api_points(owner_api, run) == file_points(run) == 20


def test_queued_run_whose_message_redis_lost_is_sent_again(embedded_services, start_worker, engine_command, owner, owner_api, wait) -> None:
    run = run_with(owner, "succeed", steps=10)
    from workers.celery_app import app

    with app.connection_for_write() as conn:
        conn.default_channel.client.delete("cpu")  # as if Redis came back without its data
    start_worker(extra_env={"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_WORKER_LOST_AFTER_S": "2", "INFLIGHT_REQUEUE_AFTER_S": "2", **FAST})
    done = wait(lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r, timeout=60, message="the re-sent run to run")
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert api_points(owner_api, run) == file_points(run) == 20


def test_postgres_outage_longer_than_threshold_marks_no_healthy_run_lost(embedded_services, start_worker, engine_command, live_database_url, owner, owner_api, wait) -> None:
    relays = [TcpRelay(embedded_services.postgres_port), TcpRelay(embedded_services.postgres_port)]
    try:
        workers = []
        for relay in relays:
            url = live_database_url.replace(f":{relay.target_port}/", f":{relay.port}/")
            env = {"INFLIGHT_RL_COMMAND": engine_command, "INFLIGHT_WORKER_LOST_AFTER_S": "4", "DATABASE_URL": url, **FAST}
            workers.append(start_worker(extra_env=env))
        # Worker slots are 2 each: four runs so that each worker surely holds at least one.
        runs = [run_with(owner, "slow", steps=130) for _ in range(4)]
        wait(lambda: all(status_of(r) == RunStatus.RUNNING for r in runs), timeout=60, message="all running")
        holders = {Run.objects.get(pk=r.pk).worker_name for r in runs}
        assert holders == {w.name for w in workers}
        for relay in relays:
            relay.cut_off()
        time.sleep(6.0)  # longer than the 4 s threshold: every heartbeat is now stale
        relays[0].restore()
        time.sleep(2.0)  # the first worker back must not judge the second by its stale heartbeat
        relays[1].restore()
        finals = [wait(lambda r=r: (x := Run.objects.get(pk=r.pk)).is_terminal and x, timeout=60, message="runs to end") for r in runs]
        assert [f.status for f in finals] == [RunStatus.SUCCEEDED] * 4, [f.error for f in finals]
        for r in runs:
            assert api_points(owner_api, r) == file_points(r) == 260
        # One line when the outage began and one when it ended, not a traceback per try.
        for worker in workers:
            log = worker.log()
            assert "is back after" in log and log.count("Traceback") == 0, log[-3000:]
            assert log.count("unavailable") <= 4  # heartbeat + per run: once each, not per try
    finally:
        for relay in relays:
            relay.close()


def test_demo_restarts_a_crashed_worker_and_web_server(live_database_url, transactional_db, tmp_path: Path, wait) -> None:
    port = free_port()
    out = tmp_path / "demo.out"
    env = {**os.environ, "DATABASE_URL": live_database_url, **FAST}
    with open(out, "wb") as handle:
        demo = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--no-run", "--port", str(port), "--log-dir", str(tmp_path)],
            cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def pid_of(name: str, after: int = 0) -> int:
        found = [int(line.split("(pid ")[1].split(")")[0]) for line in out.read_text().splitlines() if line.strip().startswith(f"{name} started (pid ")]
        return found[-1] if found and found[-1] != after else 0

    def serving() -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait(lambda: "Inflight is up" in out.read_text() or demo.poll() is not None, timeout=90, message="the demo to start")
        assert demo.poll() is None, out.read_text()[-3000:]
        worker_pid, web_pid = pid_of("worker"), pid_of("web")
        os.kill(worker_pid, signal.SIGKILL)
        new_worker = wait(lambda: pid_of("worker", after=worker_pid), timeout=20, message="the worker to be restarted")
        assert "worker (pid %d) exited with code -9; restarting" % worker_pid in out.read_text()
        assert serving() and demo.poll() is None  # the platform kept serving
        wait(lambda: "ready." in (tmp_path / "worker.log").read_text().split("exited with code -9")[-1], timeout=60, message="the new worker to be ready")
        os.kill(web_pid, signal.SIGKILL)
        wait(lambda: pid_of("web", after=web_pid), timeout=20, message="the web server to be restarted")
        wait(serving, timeout=60, message="the restarted web server to serve")
        assert demo.poll() is None and pid_of("worker") == new_worker
    finally:
        if demo.poll() is None:
            os.kill(demo.pid, signal.SIGTERM)
        demo.wait(60)
    assert "all stopped." in out.read_text()


def test_submitting_while_redis_is_down_answers_503_with_the_true_state(embedded_services, transactional_db, owner, owner_api) -> None:
    pid, port = _running_redis(embedded_services.folder)
    os.kill(pid, signal.SIGKILL)
    try:
        response = owner_api.post("/api/runs/", {"name": "r", "config": {"name": "r"}}, content_type="application/json")
        assert response.status_code == 503, response.content
        body = response.json()
        assert body["run"]["status"] == RunStatus.FAILED and "could not be queued" in body["error"]
    finally:
        start_redis(embedded_services.folder, port)


def test_api_answers_503_while_postgres_is_away(embedded_services, live_database_url, transactional_db, owner, tmp_path: Path, wait) -> None:
    from inflight.accounts.services import create_token

    relay = TcpRelay(embedded_services.postgres_port)
    port = free_port()
    url = live_database_url.replace(f":{relay.target_port}/", f":{relay.port}/")
    log_path = tmp_path / "daphne.log"
    env = {**os.environ, "DATABASE_URL": url, "INFLIGHT_WEB_SWEEPER": "0"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "inflight.asgi:application"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    key = create_token(owner).key

    def get(path: str) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Token {key}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        def up() -> bool:
            try:
                return get("/api/runs/")[0] == 200
            except OSError:
                assert process.poll() is None, log_path.read_text()[-3000:]
                return False

        wait(up, timeout=60, message="daphne to serve")
        relay.cut_off()
        status, body = get("/api/runs/")
        assert status == 503 and "database is unavailable" in body["error"]
        relay.restore()
        assert get("/api/runs/")[0] == 200
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
        relay.close()
