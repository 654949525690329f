"""A bench that starts the platform's services (bench/benchlib.py `platform_services`) stops them
when it is stopped: `timeout`, `kill` or CI's cap send SIGTERM, and a bench killed in place used to
leave its PostgreSQL and Redis running under var/bench-*/PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_bench_stopped_by_sigterm_stops_its_postgres_and_redis() -> None:
    root = Path(settings.REPO_ROOT)
    code = (
        "import sys, time; sys.path.insert(0, 'bench'); from benchlib import platform_services\n"
        "with platform_services('sigterm-test', fast_unsafe=True):\n"
        "    print('up', flush=True); time.sleep(300)\n"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    bench = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (line := bench.stdout.readline()):
            lines.append(line)
            if line.strip() == "up":
                break
        assert lines and lines[-1].strip() == "up", "".join(lines)[-3000:]
        folder = root / "var" / "bench-sigterm-test" / str(bench.pid)
        postmaster = int((folder / "postgres" / "postmaster.pid").read_text().split()[0])
        assert _alive(postmaster)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 30
        while _alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(postmaster)
        assert not folder.exists()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        left = root / "var" / "bench-sigterm-test" / str(bench.pid)
        if left.exists():  # the bench did not stop them: do it here, so no test leaves them running
            from inflight.devservices import stop_services

            stop_services(left)
