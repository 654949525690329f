"""A resumed run stays live, on the real stack (real engine on the tiny model, Celery worker,
PostgreSQL, Redis, Daphne) and in Chromium: a run cancelled after its first checkpoints is
resumed through the API while its page is open, and without a reload that page shows it running
again, its charts advance past the cancelled step while it still runs (not only once it ended),
new checkpoints appear in its list, and Stop / Resume / Delete follow its status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from inflight.runs.models import MetricPoint, Run, RunStatus
from tests.platform.test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server, playwright_session  # noqa: F401 (fixture)
from tests.platform.test_run_actions_browser import sign_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]

MAX_STEPS = 40
from tests.platform.screenshots import SCREENSHOTS  # noqa: E402  (docs/screenshots/ only when asked)


def config(tiny_model: Path) -> dict[str, Any]:
    return {
        "name": "resumed-live",
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 8},
        "sampling": {"max_new_tokens": 16},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": MAX_STEPS, "lr": 1e-4, "checkpoint_every": 4},
        "eval": {"heldout_every_n_steps": 20, "heldout_k": 1},
    }


def stored_max_step(run_id: int) -> int:
    return max(MetricPoint.objects.filter(run_id=run_id, name="train/loss").values_list("step", flat=True), default=0)


def test_a_resumed_run_stays_live_on_its_open_page(daphne_server: str, start_worker, owner, owner_api, tiny_model: Path, wait: Callable[..., Any]) -> None:  # noqa: F811


    worker = start_worker()
    response = owner_api.post("/api/runs/", json.dumps({"name": "resumed-live", "config": config(tiny_model)}), content_type="application/json")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    wait(lambda: Run.objects.get(pk=run_id).status == RunStatus.RUNNING, timeout=300, interval=0.5, message="running")
    run_dir = Path(Run.objects.get(pk=run_id).run_dir)
    wait(lambda: (run_dir / "checkpoints" / "step_000004").is_dir(), timeout=300, interval=0.1, message="the step-4 checkpoint")
    assert owner_api.post(f"/api/runs/{run_id}/cancel/").status_code == 200
    cancelled = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=120, interval=0.5, message="the cancel")
    assert cancelled.status == RunStatus.CANCELLED, cancelled.error
    cancelled_at_step = stored_max_step(run_id)

    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1500})
            page.set_default_timeout(60_000)
            sign_in(page, daphne_server, "owner", "owner-password-1", f"/runs/{run_id}/")
            page.wait_for_selector("#run-status[data-status=cancelled]")
            page.wait_for_selector("#resume-button")
            assert page.locator("#stop-form").is_hidden()

            # Resumed elsewhere (the API, as the CLI or another tab would): the open page follows.
            response = owner_api.post(f"/api/runs/{run_id}/resume/")
            assert response.status_code == 200, response.content
            page.wait_for_selector("#run-status[data-status=running]", timeout=300_000)
            page.wait_for_selector("#stop-form:not(.hidden)")
            assert page.locator("#resume-button").count() == 0 and page.locator("#delete-button").count() == 0

            # The charts advance past the cancelled step while the resumed attempt still runs.
            def charted_step() -> int:
                return int(page.get_attribute("#points-info", "data-max-step") or -1)

            target = cancelled_at_step + 6
            wait(lambda: charted_step() >= target, timeout=300, interval=0.5, message=f"the chart to pass step {target}")
            run = Run.objects.get(pk=run_id)
            assert run.status == RunStatus.RUNNING and stored_max_step(run_id) < MAX_STEPS, (
                "the resumed run's metrics arrived only after it ended"
            )
            # A checkpoint written by the resumed attempt shows up in the open page's list.
            later = ((cancelled_at_step // 4) + 2) * 4
            page.wait_for_selector(f"#checkpoints-table tr[data-step='{later}']", timeout=300_000)
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "run_page_resumed.png"), full_page=False)

            done = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=400, interval=1, message="the resumed run to end")
            assert done.status == RunStatus.SUCCEEDED, (done.error, worker.log()[-3000:])
            page.wait_for_selector("#run-status[data-status=succeeded]", timeout=60_000)
            page.wait_for_selector("#delete-button", timeout=60_000)
            assert page.locator("#stop-form").is_hidden()
            assert page.locator("#live-text").inner_text() == "finished"
        finally:
            browser.close()

    # Every step charted once, the last one included.
    steps = sorted(MetricPoint.objects.filter(run_id=run_id, name="train/loss").values_list("step", flat=True))
    assert steps == list(range(1, MAX_STEPS + 1))
