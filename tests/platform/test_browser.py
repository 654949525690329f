"""End to end in a real browser: Debian's chromium driven by Playwright against a real Daphne
server (HTTP + WebSockets) and a real Celery worker that runs the real tiny RL run.

Sign in → launch the tiny CPU preset (shortened) from the create page → watch a chart gain
points over the WebSocket → stop it → see `cancelled`. A screenshot of the run page goes to
/tmp/run_page.png.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from inflight.devservices import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextmanager
def playwright_session() -> Iterator[Any]:
    """Playwright's sync API, for tests that also read the database between page steps.

    Playwright keeps an event loop in this thread, so Django takes those ORM calls (never made from
    the loop) for async code and refuses them: they are allowed for the session's length. And the
    ORM runs in another context there (asgiref's Local follows the loop), so the connections it
    opens are not the ones the test teardown closes: they are closed here, or at the end of the
    test session they hold the test database open ("is being accessed by other users")."""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    allowed = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            try:
                yield playwright
            finally:
                connections.close_all()
    finally:
        if allowed is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = allowed


def signed_in_page(browser: Any, base: str, path: str, width: int = 1360, height: int = 900) -> Any:
    """A new page of `browser` signed in as the test user `owner`, at `path`."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(30_000)
    page.goto(f"{base}/accounts/login/?next={path}")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "owner-password-1")
    page.click("button[type=submit]")
    page.wait_for_load_state("networkidle")
    return page
SCREENSHOT = Path("/tmp/run_page.png")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's Chromium through Playwright's sync API, for the tests that drive pages step by step."""
    with playwright_session() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def daphne_server(live_database_url: str, transactional_db: None, tmp_path: Path, wait: Callable[..., Any]) -> Iterator[str]:
    """The project's ASGI application under Daphne on a free 127.0.0.1 port, on the test database."""
    port = free_port()
    log_path = tmp_path / "daphne.log"
    env = {**os.environ, "DATABASE_URL": live_database_url, "DJANGO_SETTINGS_MODULE": "inflight.settings", "OMP_NUM_THREADS": "1",
           "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "inflight.asgi:application"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        import socket

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"daphne exited:\n{log_path.read_text()[-3000:]}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait(listening, timeout=60, message="daphne to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def test_launch_watch_and_stop_a_run_in_the_browser(daphne_server: str, start_worker, owner, tiny_model: Path, wait: Callable[..., Any]) -> None:
    from inflight.runs.models import Run

    worker = start_worker("cpu")
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1500})
            page.set_default_timeout(60_000)

            page.goto(f"{daphne_server}/runs/new/?preset=tiny-cpu")
            assert "/accounts/login/" in page.url  # login required
            page.screenshot(path="/tmp/login_page.png")
            page.fill("#id_username", "owner")
            page.fill("#id_password", "owner-password-1")
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(r".*/runs/new/\?preset=tiny-cpu$"))

            # The preset filled the generated form; shorten the run for the test (the response
            # budget stays the preset's: truncated answers score 0 and their groups carry no gradient).
            assert page.input_value('input[name="model.path"]') == "var/models/tiny"
            for name, value in {
                "name": "browser-tiny",
                "trainer.max_steps": "200",
                "trainer.samples_per_step": "8",
                "actor.group_size": "4",
                "actor.groups_in_flight": "2",
                "max_wall_time_s": "300",
            }.items():
                page.fill(f'input[name="{name}"]', value)
            page.check('input[name="accelerations.histospec.enabled"]', force=True)
            page.click("#launch-form")
            page.wait_for_url(re.compile(r".*/runs/\d+/$"))
            run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])

            # The charts fill in live: the bucket count shown under the toolbar grows.
            def buckets() -> int:
                return int(page.get_attribute("#points-info", "data-buckets") or 0)

            def max_step() -> int:
                return int(page.get_attribute("#points-info", "data-max-step") or -1)

            wait(lambda: buckets() > 0, timeout=300, interval=1, message=f"first points on the run page (worker log: {worker.log_path})")
            first = buckets()
            # Trainer steps put points at new x positions: wait for a few of them.
            wait(lambda: max_step() >= 3 and buckets() > first, timeout=400, interval=1, message="the chart to gain points")
            assert page.locator(".chart-card .plot .main-svg").count() > 0
            assert page.locator("#live-text").inner_text() == "live"
            page.screenshot(path=str(SCREENSHOT), full_page=True)

            page.once("dialog", lambda dialog: dialog.accept())  # "Stop run #N?" (issue 26)
            page.click("#stop-button")
            page.wait_for_url(re.compile(rf".*/runs/{run_id}/$"))
            wait(lambda: page.get_attribute("#run-status", "data-status") == "cancelled", timeout=120, interval=0.5, message="cancelled on the page")
            assert page.locator("#run-status .status").inner_text() == "cancelled"

            # The other pages render what the run logged (screenshots for a human look).
            page.goto(f"{daphne_server}/")
            assert page.locator(f'[data-status-of="{run_id}"]').inner_text() == "cancelled"
            page.screenshot(path="/tmp/runs_list.png", full_page=True)
            page.goto(f"{daphne_server}/compare/?runs={run_id}")
            page.wait_for_selector(".chart-card .main-svg")
            assert page.locator("#metric-select option").count() > 5
            page.screenshot(path="/tmp/compare_page.png", full_page=True)
            page.goto(f"{daphne_server}/leaderboard/?sort=-success_best")
            assert page.locator("#leaderboard tbody tr").first.inner_text().startswith(str(run_id))
            page.screenshot(path="/tmp/leaderboard_page.png", full_page=True)
            page.goto(f"{daphne_server}/workers/")
            # A user who is not staff sees each worker's queues and CPUs, never its host name.
            workers_table = page.locator("table").inner_text()
            assert "alive" in workers_table and worker.name not in workers_table
            page.screenshot(path="/tmp/workers_page.png", full_page=True)
            page.goto(f"{daphne_server}/runs/new/?preset=tiny-cpu")
            page.fill('input[name="trainer.lr"]', "fast")
            page.click("#launch-form")
            assert "valid number" in page.locator('[data-error-for="trainer.lr"]').inner_text()
            page.screenshot(path="/tmp/create_page.png", full_page=False)
        finally:
            browser.close()
    # (The ORM is used only here: Playwright's sync API runs an event loop in this thread.)
    run = Run.objects.get(pk=run_id)
    assert run.name == "browser-tiny" and run.owner == owner and run.status == "cancelled"
    assert run.config["accelerations"]["histospec"]["enabled"] is True and run.config["trainer"]["samples_per_step"] == 8
