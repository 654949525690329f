"""Why a run ended (issue 33, defect 7): a run its wall-time budget stopped at step 16 of 1000
reported `succeeded` everywhere, like a finished one. The engine's status.json `ended_reason` /
`ended_detail` reach the worker's outcome, the database, the API, the run page and `inflight watch`
(exit 3, not 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rl_core.rundir.layout import ended_sentence, write_status
from tests.platform.test_browser import CHROMIUM, daphne_server, playwright_session, signed_in_page  # noqa: F401 - fixtures used by name
from tests.platform.test_cli import INFLIGHT, Cli
from workers.supervisor import NullReporter, Outcome, RunSupervisor

BUDGET_STOP = ended_sentence("wall_time", 16, 1000, 60)
SCREENSHOT = Path("/tmp/run_page_ended_reason.png")


def _ended_run(owner: Any, status: str, **ended: str) -> Any:
    from inflight.runs import services
    from inflight.runs.models import RunStatus

    run = services.create_run(owner, "budget", {})
    services.transition_run(run.pk, RunStatus.STARTING)
    services.transition_run(run.pk, RunStatus.RUNNING)
    return services.finish_run(run.pk, status, "", **ended)


def test_the_sentence_names_the_budget_and_the_step() -> None:
    assert BUDGET_STOP == "stopped by its wall-time budget (max_wall_time_s 60 s) at step 16 of 1000"
    assert ended_sentence("max_steps", 1000, 1000) == "finished its steps at step 1000 of 1000"
    assert ended_sentence("hung", 3, 500, cause="server0 stopped answering") == "failed: server0 stopped answering at step 3 of 500"
    assert ended_sentence(None) == ""


def test_the_worker_takes_why_from_status_json(tmp_path: Path) -> None:
    write_status(tmp_path, "succeeded", ended_reason="wall_time", ended_detail=BUDGET_STOP)
    outcome = RunSupervisor(tmp_path, "", ["true"], NullReporter(), cwd=tmp_path).outcome(0)
    assert outcome == Outcome("succeeded", "", 0, "wall_time", BUDGET_STOP)


@pytest.mark.django_db
def test_the_api_says_why_each_run_ended(owner, owner_api) -> None:
    from inflight.runs import services
    from inflight.runs.models import RunStatus

    budget = _ended_run(owner, RunStatus.SUCCEEDED, ended_reason="wall_time", ended_detail=BUDGET_STOP)
    body = owner_api.get(f"/api/runs/{budget.pk}/").json()
    assert (body["status"], body["ended_reason"], body["ended"]) == ("succeeded", "wall_time", BUDGET_STOP)
    # An end the platform decides itself says why too; a run still going says nothing.
    queued = services.create_run(owner, "queued", {})
    assert owner_api.get(f"/api/runs/{queued.pk}/").json()["ended_reason"] == ""
    services.request_cancel(queued, owner)
    body = owner_api.get(f"/api/runs/{queued.pk}/").json()
    assert (body["status"], body["ended_reason"], body["ended"]) == ("cancelled", "cancelled", "cancelled")
    # A resumed run is running again: the old end no longer describes it.
    services.transition_run(queued.pk, RunStatus.QUEUED)
    assert owner_api.get(f"/api/runs/{queued.pk}/").json()["ended_reason"] == ""


@pytest.mark.slow
@pytest.mark.skipif(not INFLIGHT.exists(), reason="the inflight console script is not installed (pip install -e .)")
def test_inflight_watch_says_a_budget_stop_and_exits_3(daphne_server: str, owner, tmp_path: Path) -> None:  # noqa: F811
    from inflight.accounts.services import create_token
    from inflight.runs.models import RunStatus

    cli = Cli(tmp_path, {"INFLIGHT_URL": daphne_server, "INFLIGHT_TOKEN": create_token(owner).key})
    budget = _ended_run(owner, RunStatus.SUCCEEDED, ended_reason="wall_time", ended_detail=BUDGET_STOP)
    watched = cli("watch", str(budget.pk), check=False)
    assert watched.returncode == 3, watched.stdout + watched.stderr
    assert f"run {budget.pk} succeeded ({BUDGET_STOP})" in watched.stdout
    finished = _ended_run(owner, RunStatus.SUCCEEDED, ended_reason="max_steps", ended_detail=ended_sentence("max_steps", 1000, 1000))
    watched = cli("watch", str(finished.pk), check=False)
    assert watched.returncode == 0 and "finished its steps at step 1000 of 1000" in watched.stdout


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)")
def test_the_run_page_says_why_the_run_ended_live_and_after_a_reload(daphne_server: str, owner) -> None:  # noqa: F811
    from inflight.runs import services
    from inflight.runs.models import RunStatus
    from tests.platform.test_browser import CHROMIUM_ARGS

    run = services.create_run(owner, "budget", {})
    services.transition_run(run.pk, RunStatus.STARTING)
    services.transition_run(run.pk, RunStatus.RUNNING)
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/")
            assert not page.locator("#run-status-detail").is_visible()
            page.wait_for_selector("#live-indicator.live-live")  # the socket is open: the end is pushed
            services.finish_run(run.pk, RunStatus.SUCCEEDED, "", "wall_time", BUDGET_STOP)
            # Pushed to the open page (run.status and the panel fetch it triggers).
            page.wait_for_function(
                "text => document.getElementById('run-status-detail').textContent === text", arg=BUDGET_STOP, timeout=20_000)
            page.reload()
            page.wait_for_load_state("networkidle")
            assert page.locator("#run-status-detail").inner_text() == BUDGET_STOP
            assert page.locator("#run-status").get_attribute("data-status") == "succeeded"
            page.screenshot(path=str(SCREENSHOT), full_page=False)
        finally:
            browser.close()
