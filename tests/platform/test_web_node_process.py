"""What the web node's process does unlike the others (inflight/asgi.py, settings.py).

It hands the GIL to a waiting thread often: its event loop gives the GIL up at every socket call
and must get it back while a view thread renders a panel; with CPython's 5 ms switch interval the
pushes queued behind that thread for seconds (bench/platform_scale.py, 60 live runs and 150 pages:
push p95 6.4 s, 0.33 s at 0.5 ms). And it pools its database connections: each page request runs on
a thread of its own, so a connection kept per thread was a new PostgreSQL backend per request.
A worker keeps both as they were: its supervisor threads are CPU-bound together, and it must
reconnect at once after an outage to write its heartbeat."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings


def _process_of(module: str, **env: str) -> dict:
    """A fresh process's GIL switch interval and database settings once it imported `module` (as
    Daphne imports inflight.asgi, a worker workers.tasks)."""
    setup = "" if module == "inflight.asgi" else "import django; django.setup(); "  # the ASGI module sets Django up itself
    code = (f"import json, sys; {setup}import {module}; from django.conf import settings; "
            "import gc; print(json.dumps({'switch': sys.getswitchinterval(), 'database': settings.DATABASES['default'], "
            "'frozen': gc.get_freeze_count()}, default=str))")
    root = settings.REPO_ROOT
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "inflight.settings", "INFLIGHT_WEB_SWEEPER": "0", "PYTHONWARNINGS": "ignore", "PYTHONPATH": f"{root / 'platform'}{os.pathsep}{root}", **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_web_node_switches_the_gil_every_half_millisecond_and_pools_its_connections() -> None:
    web = _process_of("inflight.asgi")
    assert abs(web["switch"] - 0.0005) < 1e-9
    assert web["database"]["OPTIONS"]["pool"]["max_size"] >= 16 and web["database"]["CONN_HEALTH_CHECKS"] is True


def test_the_web_node_leaves_what_it_loaded_out_of_the_collectors_full_collections() -> None:
    """With 500 open pages a full collection walked Django, Channels and Twisted too, pausing every
    push of the process for 140-610 ms (bench/RESULTS.md); frozen at start-up, they are not walked."""
    assert _process_of("inflight.asgi")["frozen"] > 20_000


def test_a_worker_keeps_pythons_switch_interval_and_its_own_connections() -> None:
    worker = _process_of("workers.tasks")
    assert abs(worker["switch"] - 0.005) < 1e-9
    assert "pool" not in worker["database"].get("OPTIONS", {})
    assert worker["database"]["CONN_MAX_AGE"] >= 60 and worker["database"]["CONN_HEALTH_CHECKS"] is True


def test_the_web_nodes_switch_interval_and_pool_are_environment_settings() -> None:
    web = _process_of("inflight.asgi", INFLIGHT_GIL_SWITCH_S="0.002", INFLIGHT_DB_POOL="0")
    assert abs(web["switch"] - 0.002) < 1e-9 and "pool" not in web["database"].get("OPTIONS", {})


def test_a_web_nodes_processes_split_its_connection_pool() -> None:
    """inflight.web.node tells each process how many there are: the node holds INFLIGHT_DB_POOL_MAX
    connections however many processes serve it (docker-compose's PostgreSQL takes 100)."""
    assert _process_of("inflight.asgi", INFLIGHT_WEB_PROCESSES="2")["database"]["OPTIONS"]["pool"]["max_size"] == 16
    assert _process_of("inflight.asgi", INFLIGHT_WEB_PROCESSES="4", INFLIGHT_DB_POOL_MAX="8")["database"]["OPTIONS"]["pool"]["max_size"] == 4
