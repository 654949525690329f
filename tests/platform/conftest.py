"""Platform test setup: real embedded PostgreSQL and Redis, real Celery workers, users.

One PostgreSQL + Redis pair per pytest session, under `var/test-services/session-<pid>/`
on free ports (a folder of our own: PostgreSQL runs as an unprivileged user when we are
root, and must be able to reach its data directory — pytest's 0700 temp root would not
let it). Django's DATABASES, CHANNEL_LAYERS and Celery's broker are pointed at them
before pytest-django creates the test database. Everything started here is stopped at the
end of the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from inflight.devservices import Services, free_port, start_services, stop_services

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

# What the servers these tests start need, set explicitly (settings default to production:
# DEBUG off, Secure cookies, no serving without SECRET_KEY): the key this process signs with,
# so a session made here is valid in a Daphne started by a test, and plain-HTTP cookies.
from django.conf import settings as _django_settings  # noqa: E402

os.environ.setdefault("SECRET_KEY", _django_settings.SECRET_KEY)
_django_settings.SECRET_KEY_MISSING = False  # it is given now, to this process's servers too
os.environ.setdefault("INFLIGHT_SECURE_COOKIES", "0")
# Importing inflight.asgi in this process (the WebSocket tests) would start the web server's
# lost-run sweeper here: a thread that sweeps the test database behind the tests' backs and, once
# the session's PostgreSQL is stopped, logs into pytest's closed capture streams. Servers that a
# test needs a sweeper in (tests/platform/test_faults.py) turn it back on in their environment.
os.environ.setdefault("INFLIGHT_WEB_SWEEPER", "0")

TEST_SERVICES_ROOT = REPO_ROOT / "var" / "test-services"


def _clean_up_after_dead_sessions() -> None:
    """Stop and remove the services of earlier sessions that were killed before their teardown."""
    if not TEST_SERVICES_ROOT.is_dir():
        return
    for folder in TEST_SERVICES_ROOT.glob("session-*"):
        pid = folder.name.removeprefix("session-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stop_services(folder)
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded_services() -> Iterator[Services]:
    _clean_up_after_dead_sessions()
    folder = TEST_SERVICES_ROOT / f"session-{os.getpid()}"
    services = start_services(folder, postgres_port=free_port(), redis_port=free_port(), fast_unsafe=True)
    yield services
    stop_services(folder, only=services.started)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def platform_settings(embedded_services: Services, tmp_path_factory: pytest.TempPathFactory) -> Services:
    """Point Django (database, channel layer), Celery and child processes at the session's services."""
    from channels.layers import channel_layers
    from django.conf import settings
    from django.db import connections

    db = {"HOST": "127.0.0.1", "PORT": str(embedded_services.postgres_port), "NAME": "inflight", "USER": "postgres", "PASSWORD": ""}
    settings.DATABASES["default"].update(db)
    connections["default"].settings_dict.update(db)
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"] = [{**settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0], "address": embedded_services.redis_url}]
    channel_layers.backends.clear()
    settings.CELERY_BROKER_URL = embedded_services.redis_url
    runs_dir = tmp_path_factory.mktemp("runs")
    settings.INFLIGHT_RUNS_DIR = runs_dir
    from workers.celery_app import app

    app.conf.broker_url = embedded_services.redis_url
    os.environ.update(embedded_services.env())
    os.environ["INFLIGHT_RUNS_DIR"] = str(runs_dir)
    return embedded_services


@pytest.fixture(scope="session")
def django_db_modify_db_settings(platform_settings: Services) -> None:
    """pytest-django hook: the test database is created on the session's embedded PostgreSQL."""


@pytest.fixture(scope="session")
def live_database_url(django_db_setup: None) -> str:
    """URL of the *test* database (test_inflight), for processes the tests start."""
    from django.db import connection

    settings_dict = connection.settings_dict
    return f"postgres://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}/{settings_dict['NAME']}"


# ---------------------------------------------------------------- Celery workers


class WorkerProcess:
    def __init__(self, process: subprocess.Popen, name: str, log_path: Path) -> None:
        self.process = process
        self.name = name
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def launch_worker(
    database_url: str, log_dir: Path, queues: str = "cpu", extra_env: dict[str, str] | None = None, name: str | None = None
) -> WorkerProcess:
    """A real `celery -A workers.celery_app worker` against `database_url`; returns once it is ready.
    `name`: the node name (a restart under the same name, as `-n demo@%h` does); else a new one."""
    name = name or f"test-{uuid.uuid4().hex[:8]}@127.0.0.1"
    log_path = log_dir / f"{name.split('@')[0]}-{uuid.uuid4().hex[:4]}.log"
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "INFLIGHT_HEARTBEAT_INTERVAL_S": "0.5",
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    command = [
        sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", queues, "-P", "threads", "-c", "2",
        "-n", name, "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(process, name, log_path)
    deadline = time.monotonic() + 120
    while " ready." not in worker.log():
        if process.poll() is not None or time.monotonic() > deadline:
            worker.stop(signal.SIGKILL)
            raise RuntimeError(f"celery worker did not start:\n{worker.log()[-4000:]}")
        time.sleep(0.2)
    return worker


@pytest.fixture
def start_worker(live_database_url: str, transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers for one test (e.g. to kill them); all are stopped when it ends."""
    started: list[WorkerProcess] = []

    def start(queues: str = "cpu", extra_env: dict[str, str] | None = None, name: str | None = None) -> WorkerProcess:
        worker = launch_worker(live_database_url, tmp_path, queues, extra_env, name)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


# ---------------------------------------------------------------- a stand-in engine
#
# Writes the run directory exactly as `python -m rl_core run` documents it (status.json,
# metrics.jsonl, evals.jsonl + per-problem file) and, chosen by the config's `name`, fails,
# crashes, hangs, ignores SIGTERM or spawns a grandchild: the platform's side (worker,
# supervisor, services, Channels) is tested with it fast and deterministically;
# test_worker_real_engine.py runs the real engine.

ENGINE = r'''
import json, os, signal, subprocess, sys, time, yaml
_, command, config_path, _, out = sys.argv
assert command == "run"
config = yaml.safe_load(open(config_path))
mode = config["name"]
steps = config["trainer"]["max_steps"]
os.makedirs(os.path.join(out, "eval"), exist_ok=True)

def status(state, error=None):
    path = os.path.join(out, "status.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"state": state, "error": error, "pid": os.getpid(), "updated": time.time()}, f)
    os.replace(path + ".tmp", path)

status("starting")
GRANDCHILD = (
    "import os, time\n"
    "parent, deadline = os.getppid(), time.time() + 600\n"
    "while time.time() < deadline:\n"
    "    time.sleep(0.5)\n"
    "    if os.getppid() != parent:\n"
    "        deadline = min(deadline, time.time() + 30)\n"
)
if mode.startswith("hang"):
    # Lives until its group is killed; orphaned (its engine died with a killed worker, whose group
    # nobody kills) it outlives the engine by 30 s, longer than any test waits for the group kill,
    # and goes, instead of sleeping on for 10 minutes after the test session.
    child = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    open(os.path.join(out, "grandchild.pid"), "w").write(str(child.pid))
    if mode == "hang-ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
status("running")
metrics = open(os.path.join(out, "metrics.jsonl"), "a")
for step in range(steps):
    metrics.write(json.dumps({"t": time.time(), "step": step, "train/loss": 1.0 / (step + 1), "success/mean": step / steps}) + "\n")
    metrics.flush()
    time.sleep(0.15 if mode == "slow" else 0.02)
with open(os.path.join(out, "eval", "step_000001_math500.jsonl"), "w") as f:
    f.write(json.dumps({"problem_id": "p1", "answer": "4", "samples": ["\\boxed{4}"], "extracted": ["4"], "verdicts": [True], "mean": 1.0, "pass": True}) + "\n")
with open(os.path.join(out, "evals.jsonl"), "a") as f:
    f.write(json.dumps({"t": time.time(), "step": 1, "benchmark": "math500", "k": 1, "mean_at_k": 1.0, "pass_at_k": 1.0, "stderr": 0.0, "num_problems": 1, "num_samples": 1, "policy_versions": [1], "results_file": "eval/step_000001_math500.jsonl"}) + "\n")
if mode.startswith("hang"):
    while True:
        time.sleep(0.1)
if mode == "fail":
    status("failed", "trainer crashed: CUDA out of memory (pretend)")
    sys.exit(3)
if mode == "crash":
    sys.exit(7)
status("succeeded")
'''


@pytest.fixture(scope="session")
def engine_command(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("engine") / "fake_engine.py"
    path.write_text(ENGINE)
    return f"{sys.executable} {path}"


def wait_for(condition: Callable[[], Any], timeout: float = 60, interval: float = 0.2, message: str = "condition") -> Any:
    """Poll until `condition()` is truthy; fail the test with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture
def wait() -> Callable[..., Any]:
    return wait_for


@pytest.fixture
def hold_writes(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any, str], threading.Event]:
    """`hold_writes(module, name)`: the write `module.name` (one a worker hands to a writer thread)
    waits until the returned event is set (5 s at most): the database is slow, and the supervisor
    must not wait for it."""

    def hold(module: Any, name: str) -> threading.Event:
        write = getattr(module, name)
        released = threading.Event()

        def held(*args: Any) -> Any:
            released.wait(5)
            return write(*args)

        monkeypatch.setattr(module, name, held)
        return released

    return hold


# ---------------------------------------------------------------- users and clients


@pytest.fixture
def owner(django_user_model):
    return django_user_model.objects.create_user("owner", password="owner-password-1")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("other", password="other-password-1")


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user("staff", password="staff-password-1", is_staff=True)


def _token_client(user):
    from django.test import Client

    from inflight.accounts.services import create_token

    return Client(HTTP_AUTHORIZATION=f"Token {create_token(user).key}")


@pytest.fixture
def owner_api(owner):
    return _token_client(owner)


@pytest.fixture
def other_api(other_user):
    return _token_client(other_user)


@pytest.fixture
def staff_api(staff_user):
    return _token_client(staff_user)


def _session_client(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def owner_web(owner):
    """A browser-like client signed in as the owner (session cookie, CSRF not enforced)."""
    return _session_client(owner)


@pytest.fixture
def other_web(other_user):
    return _session_client(other_user)


@pytest.fixture
def anonymous_api():
    from django.test import Client

    return Client()


@pytest.fixture
def tiny_config() -> dict[str, Any]:
    """A run config small enough for a few seconds on one CPU core."""
    return {
        "name": "tiny-test",
        "trainer": {"max_steps": 2, "samples_per_step": 4, "threads": 1},
        "actor": {"group_size": 2, "groups_in_flight": 2},
        "sampling": {"max_new_tokens": 8},
        "inference": {"max_batch_size": 8},
    }
