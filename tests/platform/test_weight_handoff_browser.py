"""Issue 31 §2 on the run page: which way a run's weights reach its servers (the same-device handoff
or the process group, `weights/same_device_handoff` from the trainer) is a chart of its own, not a
"seconds" line in the weight-update pause chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.platform.test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - fixtures used by name
from tests.platform.test_first_hour_browser import curve, make_run

SCREENSHOT = Path("/tmp/run_page_weight_handoff.png")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def test_the_run_page_shows_which_weight_handoff_a_run_uses(daphne_server: str, owner, browser) -> None:  # noqa: F811
    run = make_run(owner, "same-device", status="running", records=curve(
        12, train__loss=lambda step: 1.0 / step, weights__update_pause_s=lambda step: 0.002 + 0.0001 * step,
        weights__handoff_write_s=lambda step: 0.004, weights__same_device_handoff=lambda step: 1.0))

    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1600)
    page.wait_for_selector("#chart-handoff .main-svg")
    assert "Weight handoff: 1 = same device" in page.locator("#chart-handoff h3").inner_text()
    # The path is not drawn among the pause's seconds.
    page.wait_for_selector("#chart-pause .main-svg")
    pause_legend = page.locator("#chart-pause .legend").text_content()
    assert "update_pause_s" in pause_legend and "same_device_handoff" not in pause_legend
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.reload()
    page.wait_for_selector("#chart-handoff .main-svg")
    assert "Weight handoff: 1 = same device" in page.locator("#chart-handoff h3").inner_text()
