"""Embedded services, settings from the environment, and the compose file's consistency with them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis
import yaml

from inflight import devservices

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def services_dir():
    folder = REPO_ROOT / "var" / "test-services" / f"devservices-{os.getpid()}"
    yield folder
    devservices.stop_services(folder)
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


_HANDED_OUT: set[int] = set()


def port_outside_the_ephemeral_range() -> int:
    """A free port below Linux's ephemeral range (32768+): `free_port()` hands out one inside it,
    which any outgoing connection made while PostgreSQL starts (this session has many) may take
    before Redis binds it, as happened once in a full run."""
    import random

    rng = random.Random(os.getpid())
    while True:
        port = rng.randrange(20000, 32000)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def test_start_reuse_stop(services_dir: Path) -> None:
    pg_port, redis_port = port_outside_the_ephemeral_range(), port_outside_the_ephemeral_range()
    first = devservices.start_services(services_dir, postgres_port=pg_port, redis_port=redis_port)
    assert sorted(first.started) == ["postgres", "redis"]
    assert first.database_url == f"postgres://postgres@127.0.0.1:{pg_port}/inflight"
    with psycopg.connect(first.database_url.replace("postgres://", "postgresql://")) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == "inflight"
        # PostgreSQL refuses root; as root we run it as the unprivileged pgserver user.
        user = conn.execute("SELECT current_setting('data_directory')").fetchone()[0]
        assert Path(user) == (services_dir / "postgres").resolve()
    assert redis.Redis.from_url(first.redis_url).ping()
    # A second start (another port asked for) reuses the running pair and its ports.
    second = devservices.start_services(services_dir, postgres_port=devservices.free_port(), redis_port=devservices.free_port())
    assert second.started == [] and second.database_url == first.database_url and second.redis_url == first.redis_url
    assert sorted(devservices.stop_services(services_dir)) == ["postgres", "redis"]
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(first.database_url.replace("postgres://", "postgresql://"), connect_timeout=2)
    assert devservices.stop_services(services_dir) == []


def test_a_taken_port_is_a_clear_error(services_dir: Path) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(devservices.ServiceError, match=f"port {port}.*INFLIGHT_REDIS_PORT"):
            devservices.start_redis(services_dir, port)


def _settings_in_subprocess(env: dict[str, str], expression: str) -> object:
    code = f"import json, os; os.environ['DJANGO_SETTINGS_MODULE']='inflight.settings'; from django.conf import settings as s; print(json.dumps({expression}, default=str))"
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "DEBUG", "SECRET_KEY", "INFLIGHT_RUNS_DIR")}
    result = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, cwd="/", timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_settings_import_without_services_and_read_the_environment() -> None:
    defaults = _settings_in_subprocess({}, "[s.DATABASES['default']['PORT'], [h['address'] for h in s.CHANNEL_LAYERS['default']['CONFIG']['hosts']], s.DEBUG, str(s.INFLIGHT_RUNS_DIR)]")
    assert defaults[0] == 55432 and defaults[1] == ["redis://127.0.0.1:56379/0"] and defaults[2] is False  # DEBUG off unless set
    assert defaults[3] == str(REPO_ROOT / "var" / "runs")
    env = {
        "DATABASE_URL": "postgres://u:p@db.example:6543/prod",
        "REDIS_URL": "redis://cache:6379/2",
        "DEBUG": "0",
        "SECRET_KEY": "s3cret",
        "ALLOWED_HOSTS": "a.example,b.example",
        "INFLIGHT_RUNS_DIR": "/data/runs",
    }
    values = _settings_in_subprocess(env, "[s.DATABASES['default']['HOST'], s.DATABASES['default']['NAME'], [h['address'] for h in s.CHANNEL_LAYERS['default']['CONFIG']['hosts']], s.CELERY_BROKER_URL, s.DEBUG, s.ALLOWED_HOSTS, str(s.INFLIGHT_RUNS_DIR)]")
    assert values == ["db.example", "prod", ["redis://cache:6379/2"], "redis://cache:6379/2", False, ["a.example", "b.example"], "/data/runs"]


def test_production_without_secret_key_refuses_to_serve() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG")}
    for entry in ("inflight.asgi", "inflight.wsgi"):
        code = f"import os; os.environ['DJANGO_SETTINGS_MODULE']='inflight.settings'; import {entry}"
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr, entry
    # The old compose placeholder is refused even by the settings themselves.
    code = "import os; os.environ['DJANGO_SETTINGS_MODULE']='inflight.settings'; import inflight.settings"
    result = subprocess.run([sys.executable, "-c", code], env={**env, "SECRET_KEY": "change-me-in-production"}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "placeholder" in result.stderr


def test_plotly_is_served_from_the_python_package() -> None:
    from django.contrib.staticfiles import finders

    found = finders.find("vendor/plotly/plotly.min.js")
    assert found and Path(found).stat().st_size > 1_000_000


def test_asgi_routes_http_and_websockets() -> None:
    from channels.routing import ProtocolTypeRouter

    from inflight.asgi import application

    assert isinstance(application, ProtocolTypeRouter)
    assert set(application.application_mapping) == {"http", "websocket"}


# ---------------------------------------------------------------- docker-compose.yml


def _settings_env_names() -> set[str]:
    sources = [REPO_ROOT / "platform" / "inflight" / "settings.py", REPO_ROOT / "rl_core" / "config" / "run_config.py"]
    names: set[str] = set()
    for source in sources:
        names |= set(re.findall(r"""(?:environ\.get|_env_bool|_env_list|_roots)\(\s*["']([A-Z_]+)["']""", source.read_text()))
    return names


def test_compose_services_and_environment_match_the_settings() -> None:
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "web", "worker-cpu", "worker-gpu"} <= set(services)
    known = _settings_env_names()
    for name in ("web", "worker-cpu", "worker-gpu"):
        env = services[name]["environment"]
        unknown = {key for key in env if key not in known and not key.startswith("NVIDIA_")}
        assert not unknown, f"{name} sets variables no setting reads: {unknown}"
        assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "INFLIGHT_RUNS_DIR"} <= set(env)
        host = re.match(r"postgres://[^@]+@([^:/]+)", env["DATABASE_URL"]).group(1)
        assert host == "postgres" and env["REDIS_URL"].startswith("redis://redis:")
    pg_env = services["postgres"]["environment"]
    assert services["web"]["environment"]["DATABASE_URL"] == (
        f"postgres://{pg_env['POSTGRES_USER']}:{pg_env['POSTGRES_PASSWORD']}@postgres:5432/{pg_env['POSTGRES_DB']}"
    )
    from workers.celery_app import app

    queues = {queue.name for queue in app.conf.task_queues}
    cpu_command = services["worker-cpu"]["command"]
    gpu_command = services["worker-gpu"]["command"]
    assert cpu_command[cpu_command.index("-Q") + 1] == "cpu" and gpu_command[gpu_command.index("-Q") + 1] == "gpu"
    assert {"cpu", "gpu"} == queues
    assert services["worker-gpu"]["runtime"] == "nvidia"
    assert services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # Both web nodes are `inflight.web.node`: Daphne processes serving the ASGI application, one per core.
    from inflight.web.node import APPLICATION

    assert APPLICATION == "inflight.asgi:application"
    assert all("-m inflight.web.node -b 0.0.0.0 -p 8000" in " ".join(services[name]["command"]) for name in ("web", "web-2"))
    # The runs volume is shared by the web server and both workers.
    for name in ("web", "worker-cpu", "worker-gpu"):
        assert "runs:/data/runs" in services[name]["volumes"]


def test_demo_command_serves_runs_and_ctrl_c_stops_everything(live_database_url: str, transactional_db: None, engine_command: str, owner, wait) -> None:
    """`make demo`'s command against the test database (its embedded-services step is covered
    above), with the stand-in engine: a run left `queued` without a broker message (the embedded
    Redis keeps nothing across restarts) is sent again and runs; Ctrl-C stops web and worker."""
    from inflight.accounts.models import ApiToken
    from inflight.accounts.services import authenticate_token
    from inflight.runs.models import Run, RunStatus

    stranded = Run.objects.create(owner=owner, name="succeed", config={"name": "succeed", "trainer": {"max_steps": 3}})
    port = devservices.free_port()
    env = {**os.environ, "DATABASE_URL": live_database_url, "INFLIGHT_DEMO_PORT": str(port), "INFLIGHT_RL_COMMAND": engine_command}
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--no-run"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        done = wait(lambda: (r := Run.objects.get(pk=stranded.pk)).is_terminal and r, timeout=180, message="the stranded run to run")
        assert done.status == RunStatus.SUCCEEDED and done.worker_name.startswith("demo@"), done.error
        demo.send_signal(signal.SIGTERM)  # like Ctrl-C (SIGINT), which the same handler stops
        output, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, output
    assert f"Inflight is up at http://127.0.0.1:{port}/" in output and "all stopped." in output
    token = re.search(r"API token\s+([0-9a-f]{40})", output).group(1)
    assert authenticate_token(token).username == "demo"
    assert not ApiToken.objects.filter(digest=token).exists()  # only its digest is stored
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # Daphne is gone


def test_web_processes_queue_runs_on_the_configured_broker() -> None:
    """Without CELERY_* variables a web process must still send to settings.CELERY_BROKER_URL
    (Celery's default app would try amqp://localhost)."""
    code = (
        "import os, django; os.environ['DJANGO_SETTINGS_MODULE']='inflight.settings'; django.setup()\n"
        "from inflight.runs import services\n"
        "import workers.celery_app as c\n"
        "sent = []\n"
        "c.app.send_task = lambda name, **kw: sent.append((name, kw['queue'], c.app.conf.broker_url))\n"
        "services.dispatch_run(7, 'gpu')\n"
        "print(sent)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["REDIS_URL"] = "redis://127.0.0.1:6399/3"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[('inflight.execute_run', 'gpu', 'redis://127.0.0.1:6399/3')]"
