"""In a real browser (Debian chromium, Playwright) against Daphne on the test database:
"New run from this" → the diff appears as a field is edited (on the YAML tab too) → launch → the new run's page
names its parent; and a compare view's address, shared, opens the same view for another user
who may see the runs (staff), while a user who may not gets a 404."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
from django.utils import timezone

from inflight.runs import services
from inflight.runs.models import Run, RunStatus
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest
from tests.platform.test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server, playwright_session  # noqa: F401 (fixture)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def finished_run(owner, tiny_config: dict, name: str, slope: float) -> Run:
    run = services.create_run(owner, name, {**tiny_config, "name": name})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    points = []
    for step in range(1, 9):
        points += [PointIn(line=step, name="success/mean", step=step, t=1000.0 + step, value=slope * step),
                   PointIn(line=step, name="train/loss", step=step, t=1000.0 + step, value=1.0 / step)]
    live_ingest.ingest_metrics(run.pk, points)
    return run


def sign_in(page: Any, base: str, username: str, password: str, then: str) -> None:
    page.goto(f"{base}{then}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def test_clone_edit_launch_and_a_shared_compare_url(daphne_server: str, owner, staff_user, other_user, tiny_config: dict, wait: Callable[..., Any]) -> None:  # noqa: F811

    first = finished_run(owner, tiny_config, "first", 0.05)
    second = finished_run(owner, tiny_config, "second", 0.1)
    before = set(Run.objects.values_list("pk", flat=True))
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1400})
            page.set_default_timeout(60_000)
            sign_in(page, daphne_server, "owner", "owner-password-1", f"/runs/{first.pk}/")
            page.click("#clone-button")
            page.wait_for_url(re.compile(rf".*/runs/{first.pk}/clone/$"))
            assert page.locator("#clone-diff-table tbody tr").count() == 0, page.locator("#clone-diff-table tbody").inner_text()
            page.fill('input[name="trainer.lr"]', "0.0003")
            page.fill('input[name="trainer.max_steps"]', "3")
            page.fill('input[name="name"]', "first-lr3e-4")
            rows = page.locator("#clone-diff-table tbody tr")
            wait(lambda: rows.count() == 2, timeout=10, message="two changed fields in the diff")
            assert sorted(rows.nth(i).get_attribute("data-path") for i in range(2)) == ["trainer.lr", "trainer.max_steps"]
            assert "0.0003" in page.locator('#clone-diff-table tr[data-path="trainer.lr"]').inner_text()
            page.screenshot(path="/tmp/clone_page.png", full_page=False)

            # One config, two views (config_sync.js): the YAML tab shows the form's edits and diffs
            # what is typed there (asked of the server as one types); a value a submission would
            # refuse, or an unreadable text, says why under the diff; back on the Form tab, the
            # form holds what the YAML said.
            page.click('.tab[data-tab="yaml"]')
            editor = page.locator('textarea[name="config_yaml"]')
            wait(lambda: rows.count() == 2 and "max_steps: 3" in editor.input_value(), timeout=30, message="the form's edits on the YAML tab")
            editor.fill(re.sub(r"max_steps: \d+", "max_steps: 9", editor.input_value()))
            max_steps_row = page.locator('#clone-diff-table tr[data-path="trainer.max_steps"]')
            wait(lambda: rows.count() == 2 and "9" in max_steps_row.inner_text(), timeout=30, message="the YAML edit in the diff")
            error = page.locator("#clone-diff-error")
            assert not error.is_visible()
            valid_yaml = editor.input_value()
            # A value a submission would refuse: the diff stays, and the refusal shows under it.
            editor.fill(re.sub(r"max_steps: \d+", "max_steps: -9", valid_yaml))
            wait(lambda: error.is_visible() and "trainer.max_steps" in error.inner_text() and rows.count() == 2,
                 timeout=30, message="what a submission would be refused for, under the diff")
            editor.fill("trainer: [1, 2")
            wait(lambda: error.is_visible() and "config_yaml" in error.inner_text(), timeout=30, message="the YAML error under the diff")
            editor.fill(valid_yaml)
            wait(lambda: not error.is_visible() and rows.count() == 2, timeout=30, message="the readable YAML's diff again")
            page.click('.tab[data-tab="form"]')
            wait(lambda: rows.count() == 2 and not error.is_visible() and page.input_value('input[name="trainer.max_steps"]') == "9",
                 timeout=30, message="the form's diff again, with the YAML's max_steps")
            with page.expect_navigation():
                page.click("#launch-form")
            page.wait_for_url(re.compile(r".*/runs/\d+/$"))
            assert f"Cloned from #{first.pk} first" in page.locator("#run-lineage").inner_text()

            # Compare: pick a metric, the samples axis and a smoothing; the address keeps them.
            page.goto(f"{daphne_server}/compare/?runs={first.pk},{second.pk}")
            page.wait_for_selector(".chart-card .main-svg")
            page.select_option("#metric-select", ["train/loss"])
            page.check('input[name="xaxis"][value="samples"]')
            page.locator("#smoothing").fill("0.25")
            wait(lambda: "smooth=0.25" in page.url and "x=samples" in page.url and "metrics=train%2Floss" in page.url, timeout=10, message="the view in the address")
            shared = page.url

            staff = browser.new_page(viewport={"width": 1360, "height": 1000})
            sign_in(staff, daphne_server, "staff", "staff-password-1", "/")
            staff.goto(shared)
            staff.wait_for_selector(".chart-card .main-svg")
            assert staff.locator('input[name="xaxis"][value="samples"]').is_checked()
            assert staff.input_value("#smoothing") == "0.25"
            assert [o.get_attribute("value") for o in staff.locator("#metric-select option:checked").all()] == ["train/loss"]
            assert staff.locator(".chart-card").count() == 1
            staff.screenshot(path="/tmp/compare_shared.png", full_page=False)

            stranger = browser.new_page()
            sign_in(stranger, daphne_server, "other", "other-password-1", "/")
            response = stranger.goto(shared)
            assert response is not None and response.status == 404
        finally:
            browser.close()
    clone = Run.objects.exclude(pk__in=before).get()
    # Launched from the form after the YAML tab set max_steps 9: both views are one config.
    assert clone.parent_id == first.pk and clone.config["trainer"]["lr"] == 0.0003 and clone.config["trainer"]["max_steps"] == 9
