"""Issue 33, defect 1, on the run page: a run whose reward, evaluation, loss and gradient norm are 0
for its whole life had those charts labelled "constant" and moved to the bottom. They are the
learning signal: drawn full size, in their place, whatever their values; other constant charts
still step aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.platform.test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - fixtures used by name
from tests.platform.test_first_hour_browser import curve, make_run

SCREENSHOT = Path("/tmp/run_page_no_learning_signal.png")
SIGNAL_CHARTS = ("reward", "eval", "loss", "grad_norm")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def test_a_run_that_cannot_learn_keeps_its_signal_charts_full_size(daphne_server: str, owner, browser) -> None:  # noqa: F811
    zero = lambda step: 0.0  # noqa: E731
    run = make_run(owner, "cannot-learn", status="running", records=curve(
        20, train__reward_mean=zero, reward__mean=zero, success__mean=zero, train__loss=zero, train__grad_norm=zero,
        eval__math500__mean_at_k=zero, train__dropped_stale=zero, train__entropy=lambda step: 0.5 + 0.01 * step))

    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1600)
    page.wait_for_selector("#chart-grad_norm .main-svg")
    for chart in SIGNAL_CHARTS:
        card = page.locator(f"#chart-{chart}")
        assert "chart-flat" not in (card.get_attribute("class") or ""), chart
        assert card.evaluate("el => getComputedStyle(el.querySelector('h3'), '::after').content") in ("none", "normal"), chart
        assert card.locator(".plot").bounding_box()["height"] > 200, chart
    # A constant that is not a learning signal still steps aside (drawn small, ordered after the others).
    assert "chart-flat" in page.locator("#chart-stale").get_attribute("class")
    orders = page.evaluate("ids => ids.map(id => getComputedStyle(document.getElementById(id)).order)",
                           [f"chart-{chart}" for chart in SIGNAL_CHARTS] + ["chart-stale"])
    assert orders == ["0", "0", "0", "0", "1"], orders
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.reload()
    page.wait_for_selector("#chart-grad_norm .main-svg")
    assert "chart-flat" not in (page.locator("#chart-reward").get_attribute("class") or "")
