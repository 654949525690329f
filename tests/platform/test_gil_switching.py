"""The web node hands the GIL to a waiting thread often (settings.INFLIGHT_GIL_SWITCH_S, inflight/asgi.py).

The web node's event loop gives the GIL up at every socket call and must get it back while a view
thread renders a panel; with CPython's 5 ms switch interval the pushes queued behind that thread for
seconds (bench/platform_scale.py, 60 live runs and 150 pages: push p95 6.4 s, 0.33 s at 0.5 ms)."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings


def _switch_interval_of(module: str, **env: str) -> float:
    """sys.getswitchinterval() of a fresh process once it imported `module`."""
    code = f"import sys, django; django.setup(); import {module}; print(sys.getswitchinterval())"
    root = settings.REPO_ROOT
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "inflight.settings", "INFLIGHT_WEB_SWEEPER": "0", "PYTHONPATH": f"{root / 'platform'}{os.pathsep}{root}", **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment, cwd=root)
    return float(out.stdout.strip())


def test_the_web_node_switches_the_gil_every_half_millisecond() -> None:
    assert abs(_switch_interval_of("inflight.asgi") - 0.0005) < 1e-9


def test_other_platform_processes_keep_pythons_switch_interval() -> None:
    # A worker's supervisor threads are CPU-bound together: ten times the handovers slowed its ingest.
    assert abs(_switch_interval_of("workers.tasks") - 0.005) < 1e-9


def test_the_switch_interval_is_an_environment_setting() -> None:
    assert abs(_switch_interval_of("inflight.asgi", INFLIGHT_GIL_SWITCH_S="0.002") - 0.002) < 1e-9
