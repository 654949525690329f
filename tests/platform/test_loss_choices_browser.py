"""The create page offers every `trainer.loss` and `trainer.is_correction` (the form is generated
from the config), refuses a correction the loss cannot use next to the field, and launches the
fixed config. Debian's chromium through Playwright on a real Daphne and the test database."""

from __future__ import annotations

import re
from typing import Any

import pytest

from test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - the fixtures are used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def test_the_create_page_offers_the_losses_and_refuses_a_correction_the_loss_cannot_use(
    daphne_server: str, browser: Any, owner,  # noqa: F811
) -> None:
    from inflight.runs.models import Run

    from rl_core.config.run_config import IS_CORRECTIONS_BY_LOSS

    page = signed_in_page(browser, daphne_server, "/runs/new/")
    loss = page.locator('[id="f-trainer.loss"]')
    offered = loss.locator("option").evaluate_all("options => options.map(o => o.value)")
    assert [value for value in offered if value] == list(IS_CORRECTIONS_BY_LOSS)
    page.fill("#f-name", "gspo-choice")
    loss.select_option("gspo")
    page.locator('[id="f-trainer.is_correction"]').select_option("tis")
    page.click("#launch-form")
    page.wait_for_selector("#error-summary")
    summary = page.inner_text("#error-summary")
    assert "trainer.is_correction" in summary and "'tis' is not allowed with trainer.loss 'gspo'" in summary, summary
    assert not Run.objects.filter(name="gspo-choice").exists()
    page.locator('[id="f-trainer.loss"]').scroll_into_view_if_needed()
    page.screenshot(path="/tmp/h8_create_loss_refused.png", full_page=False)
    # What was typed is still there after the refusal; the allowed correction launches.
    assert page.input_value('[id="f-trainer.loss"]') == "gspo"
    page.locator('[id="f-trainer.is_correction"]').select_option("none")
    page.click("#launch-form")
    page.wait_for_url(re.compile(r"/runs/\d+/$"), timeout=30_000)
    run = Run.objects.get(name="gspo-choice")
    assert run.config["trainer"]["loss"] == "gspo" and run.config["trainer"]["is_correction"] == "none"
