"""`python manage.py demo`: the whole platform on one machine, what `make demo` runs.

In order: start (or reuse) the embedded PostgreSQL + Redis, migrate, create the demo user
and print its credentials, build the tiny model if missing, start the web node (Daphne, one
process per core: `inflight.web.node`) and a Celery worker, submit the demo run (examples/tiny-cpu.yaml) and print its URL. A worker or web server
that crashes is started again (a line says so; after repeated crashes it waits longer between
tries), so one dead process never takes the platform down. Ctrl-C cancels the
demo's active runs, stops the worker and Daphne, and stops the services it started (ones
it found running are left running). Running it again reuses everything that exists.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from inflight import devservices
from rl_core.common.processes import stop_process_groups

DEMO_USERNAME = "demo"


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run the embedded demo: services, web server, worker and the tiny CPU run."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("INFLIGHT_DEMO_PORT", "8000")), help="HTTP port of the web node on 127.0.0.1.")
        parser.add_argument("--config", default=str(settings.REPO_ROOT / "examples" / "tiny-cpu.yaml"), help="Run config of the demo run.")
        parser.add_argument("--no-run", action="store_true", help="Start everything but do not submit a run.")
        parser.add_argument("--exit-after-start", action="store_true", help="Stop everything again once it is up (smoke test).")
        parser.add_argument("--log-dir", default=str(settings.REPO_ROOT / "var" / "logs"), help="Where web.log and worker.log go.")

    def handle(self, *args: Any, **options: Any) -> None:
        # Ctrl-C and `kill` both stop everything in order. Set explicitly: a shell starting us in
        # the background hands SIGINT down ignored, and SIGTERM's default would skip the cleanup.
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.specs: dict[str, tuple[list[str], Path]] = {}
        self.crashes: dict[str, list[float]] = {}
        self.started_services: list[str] = []
        logs = Path(options["log_dir"])
        logs.mkdir(parents=True, exist_ok=True)
        try:
            self.start_services()
            call_command("migrate", interactive=False, verbosity=0)
            username, password, token = self.demo_user()
            if not options["no_run"]:
                self.ensure_tiny_model()  # only the run needs it (minutes to build on a small CPU)
            self.spawn("web", [sys.executable, "-m", "inflight.web.node", "-b", "127.0.0.1", "-p", str(options["port"])], logs / "web.log")
            self.spawn("worker", [sys.executable, "-m", "celery", "-A", "workers.celery_app", "worker", "-Q", "cpu,gpu", "-P", "threads", "-c", "2", "-n", "demo@%h", "-l", "INFO"], logs / "worker.log")
            self.wait_for_http(options["port"])
            self.requeue_waiting_runs()
            base = f"http://127.0.0.1:{options['port']}"
            self.stdout.write(self.style.SUCCESS(f"\nInflight is up at {base}/"))
            self.stdout.write(f"  sign in as   {username} / {password}")
            self.stdout.write(f"  API token    {token}   (curl -H 'Authorization: Token {token}' {base}/api/runs/)")
            self.stdout.write(f"  logs         {logs}/web.log, {logs}/worker.log; runs in {settings.INFLIGHT_RUNS_DIR}")
            if not options["no_run"]:
                run = self.submit_demo_run(username, Path(options["config"]))
                self.stdout.write(self.style.SUCCESS(f"  demo run     {base}/runs/{run.pk}/"))
            self.stdout.write("Press Ctrl-C to stop everything this command started.\n")
            if options["exit_after_start"]:
                return
            self.wait_forever()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping ...")
        finally:
            self.shutdown()

    # ---------------------------------------------------------------- steps, in order

    def start_services(self) -> None:
        if "DATABASE_URL" in os.environ:
            self.stdout.write("DATABASE_URL is set: using that database and REDIS_URL, no embedded services")
            return
        services = devservices.start_services()
        self.started_services = services.started
        reused = sorted({"postgres", "redis"} - set(services.started))
        self.stdout.write(f"embedded services: {services.database_url}, {services.redis_url}" + (f" (reused: {', '.join(reused)})" if reused else ""))

    def demo_user(self) -> tuple[str, str, str]:
        from inflight.accounts.services import ensure_demo_user

        # One password per checkout, kept next to the services, so a re-run prints the same one.
        secret_file = devservices.DEFAULT_SERVICES_DIR / "demo-password"
        secret_file.parent.mkdir(parents=True, exist_ok=True)
        if not secret_file.exists():
            secret_file.write_text(secrets.token_urlsafe(9))
            secret_file.chmod(0o600)
        password = secret_file.read_text().strip()
        token_file = devservices.DEFAULT_SERVICES_DIR / "demo-token"
        if not token_file.exists():
            from inflight.accounts.models import generate_token_key

            token_file.write_text(generate_token_key())
            token_file.chmod(0o600)
        user, token = ensure_demo_user(DEMO_USERNAME, password, token_file.read_text().strip())
        return user.get_username(), password, token.key or ""

    def ensure_tiny_model(self) -> None:
        from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR

        target = settings.REPO_ROOT / DEFAULT_TINY_MODEL_DIR
        if (target / "config.json").exists():
            return
        self.stdout.write(f"building the tiny model in {target} (once) ...")
        subprocess.run([sys.executable, "-m", "rl_core", "bootstrap-tiny", str(target)], cwd=settings.REPO_ROOT, check=True)

    def child_env(self) -> dict[str, str]:
        """What the demo's web server and worker need, set explicitly: DEBUG stays off (unless the
        caller set it), a SECRET_KEY of this checkout (made once, kept next to the services), and
        cookies without the Secure flag, since the demo serves plain HTTP on 127.0.0.1."""
        env = dict(os.environ)
        if not env.get("SECRET_KEY"):
            key_file = devservices.DEFAULT_SERVICES_DIR / "secret-key"
            key_file.parent.mkdir(parents=True, exist_ok=True)
            if not key_file.exists():
                key_file.write_text(secrets.token_urlsafe(50))
                key_file.chmod(0o600)
            env["SECRET_KEY"] = key_file.read_text().strip()
        env.setdefault("INFLIGHT_SECURE_COOKIES", "0")
        return env

    def spawn(self, name: str, command: list[str], log_path: Path) -> None:
        log = open(log_path, "ab")
        # Own session: Ctrl-C reaches only this command, which then stops the children in order.
        process = subprocess.Popen(command, cwd=settings.REPO_ROOT, env=self.child_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.specs[name] = (command, log_path)
        self.children = [(n, p) for n, p in self.children if n != name] + [(name, process)]
        self.stdout.write(f"  {name} started (pid {process.pid}), log {log_path}")
        self.stdout.flush()

    def wait_for_http(self, port: int, timeout: float = 60) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout
        while True:
            for name, process in self.children:
                if process.poll() is not None:
                    raise CommandError(f"{name} exited with code {process.returncode}; see var/logs/{name}.log")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)
                return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise CommandError(f"the web server did not answer on port {port}; see var/logs/web.log")
                time.sleep(0.5)

    def requeue_waiting_runs(self) -> None:
        """The embedded Redis keeps no data across restarts, so runs still `queued` from an
        earlier session may have lost their message: send it again (a duplicate is harmless,
        `services.claim_run` lets only one delivery run it)."""
        from inflight.runs import services
        from inflight.runs.models import Run, RunStatus

        for run in Run.objects.filter(status=RunStatus.QUEUED):
            services.dispatch_run(run.pk, run.queue)

    def submit_demo_run(self, username: str, config_path: Path):
        from django.contrib.auth import get_user_model

        from inflight.runs import services
        from inflight.runs.models import ACTIVE_STATUSES, Run, RunStatus

        if not config_path.is_file():
            raise CommandError(f"demo config not found: {config_path}")
        config = yaml.safe_load(config_path.read_text()) or {}
        user = get_user_model().objects.get(username=username)
        active = Run.objects.filter(owner=user, name=config.get("name", "run"), status__in=[RunStatus.QUEUED, *ACTIVE_STATUSES]).first()
        if active is not None:
            self.stdout.write(f"  (the demo run #{active.pk} is still {active.status}; not submitting another)")
            return active
        try:
            return services.create_run(user, config.get("name", "demo"), config)
        except services.InvalidRunConfig as exc:
            raise CommandError(f"{config_path}: {exc}") from exc

    def wait_forever(self) -> None:
        """Supervise the children: one that exits is started again, after a pause that grows
        with its recent crashes (1 s, then up to 30 s when it keeps crashing)."""
        restart_at: dict[str, float] = {}
        while True:
            now = time.monotonic()
            for name, process in list(self.children):
                if process.poll() is None or name in restart_at:
                    continue
                recent = [t for t in self.crashes.get(name, []) if now - t < 300] + [now]
                self.crashes[name] = recent
                delay = min(30.0, 2.0 ** (len(recent) - 1))
                restart_at[name] = now + delay
                command, log_path = self.specs[name]
                message = f"{name} (pid {process.pid}) exited with code {process.returncode}; restarting it in {delay:.0f}s (see {log_path})"
                self.stderr.write(message)
                self.stderr.flush()
                with open(log_path, "a") as log:
                    log.write(f"--- demo: {message}\n")
            for name, when in list(restart_at.items()):
                if now >= when:
                    del restart_at[name]
                    command, log_path = self.specs[name]
                    self.spawn(name, command, log_path)
            time.sleep(0.5)

    # ---------------------------------------------------------------- stop

    def shutdown(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave things half-stopped
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        from inflight.runs import services
        from inflight.runs.models import ACTIVE_STATUSES, Run

        worker = dict(self.children).get("worker")
        if worker is not None and worker.poll() is None:
            try:
                # Cancel what our worker runs so it stops the engines cleanly before it exits.
                mine = Run.objects.filter(worker_name__startswith="demo@", status__in=list(ACTIVE_STATUSES))
                for run in mine:
                    services.request_cancel(run, run.owner)
                deadline = time.monotonic() + 30
                while mine.exists() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except Exception as exc:  # noqa: BLE001 - stopping must go on even if the database is away
                self.stderr.write(f"could not cancel the demo's runs: {exc}")
        stop_process_groups([process for _, process in reversed(self.children)], timeout_s=30)
        if self.started_services:
            from django.db import connections

            connections.close_all()
            stopped = devservices.stop_services(only=self.started_services)
            self.stdout.write(f"stopped: {', '.join(stopped)}")
        self.stdout.write("all stopped.")
