"""Issue 35 §3-§4 in Chromium: the run page's Timeline tab draws every lane (servers, trainer, actor)
with each weight update's pause, zooms to one update, and compares the predicted lag with the
measured; the create page shows the prediction beside the form and follows an edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.runs import run_paths
from rl_core.rundir.timeline import ActorTimeline, TimelineWriter
from tests.platform.test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - fixtures used by name
from tests.platform.test_first_hour_browser import curve, make_run
from tests.platform.test_timeline_pages import record_spans

TIMELINE_SCREENSHOT = Path("/tmp/run_page_timeline.png")
ZOOM_SCREENSHOT = Path("/tmp/run_page_timeline_zoom.png")
CREATE_SCREENSHOT = Path("/tmp/create_page_lag.png")
CREATE_EDITED_SCREENSHOT = Path("/tmp/create_page_lag_edited.png")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def test_the_timeline_tab_draws_every_lane_and_zooms_to_one_update(daphne_server: str, owner, browser) -> None:  # noqa: F811
    run = make_run(owner, "timeline", status="succeeded", records=curve(
        3, policy_lag__mean=lambda step: 0.9, policy_lag__share__0=lambda step: 0.1, policy_lag__share__1=lambda step: 0.9,
        weights__version=lambda step: float(step), train__dropped_stale=lambda step: 0.0,
        train__samples_consumed=lambda step: 64.0 * step))
    run_dir = run_paths.run_dir(run.pk)
    t0 = 1_800_000_000.0
    record_spans(run_dir, updates=3, t0=t0)
    actor = ActorTimeline(TimelineWriter(run_dir, "actor", "actor"), deferrable=False)
    for index in range(6):  # groups launched and finished at their own times
        actor.launched[index] = t0 + 0.3 * index
        if index == 4:
            actor.dropped_zero_advantage(f"g{index:08d}")
        actor.writer.span("group", t0 + 0.3 * index, t0 + 0.3 * index + 0.5, count=0 if index == 4 else 8,
                          reason="zero_advantage" if index == 4 else None)

    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1300)
    page.click("#timeline-tab")
    page.wait_for_selector("#timeline-chart .main-svg")
    ticks = page.eval_on_selector_all("#timeline-chart .ytick text", "els => els.map(e => e.textContent)")
    assert {"server0", "server1", "trainer"} <= set(ticks) and any(t.startswith("actor") for t in ticks)
    legend = page.locator("#timeline-chart .legend").text_content() or ""
    for name in ("pause (weight update)", "decode", "forward/backward", "optimizer", "broadcast", "group dropped: zero advantage"):
        assert name in legend, name
    assert "6 server pauses" in page.locator("#timeline-info").inner_text()
    page.wait_for_selector("#lag-compare-table tbody tr")
    compare = page.locator("#lag-compare-table").inner_text()
    assert "mean lag" in compare and "0.90" in compare  # the measured mean beside the predicted one
    page.screenshot(path=str(TIMELINE_SCREENSHOT), full_page=True)

    page.select_option("#timeline-update", "2")
    page.wait_for_timeout(500)
    # Plotly keeps a date range as it was given (ISO, "Z") or writes its own ("2027-01-15 08:00:01.2", UTC).
    width_s = page.evaluate("(function (r) { function at(s) { s = String(s).replace(' ', 'T'); return new Date(/Z$/.test(s) ? s : s + 'Z'); }"
                            " return (at(r[1]) - at(r[0])) / 1000; })(document.getElementById('timeline-chart').layout.xaxis.range)")
    assert 0.3 < width_s < 1.5  # one update (its step and the pauses), not the run's 2.1 s
    page.screenshot(path=str(ZOOM_SCREENSHOT), full_page=True)

    page.reload()
    page.click("#timeline-tab")
    page.wait_for_selector("#timeline-chart .main-svg")
    assert "6 server pauses" in page.locator("#timeline-info").inner_text()


def wait_for_mean(page, not_equal_to: str, timeout_s: float = 60) -> str:
    """The panel's mean lag once it differs from `not_equal_to` (polled here: the page's CSP forbids
    the string evaluation wait_for_function would use)."""
    for _ in range(int(timeout_s * 4)):
        text = page.locator("#lag-mean").inner_text()
        if text != not_equal_to:
            return text
        page.wait_for_timeout(250)
    raise AssertionError(f"the predicted mean stayed {not_equal_to!r}")


def test_the_create_page_shows_the_lag_prediction_beside_the_form(daphne_server: str, owner, browser) -> None:  # noqa: F811
    page = signed_in_page(browser, daphne_server, "/runs/new/", width=1360, height=1000)
    before = wait_for_mean(page, "…")
    assert page.locator(".lag-bar").count() == 9
    panel, form = page.locator("#lag-panel").bounding_box(), page.locator("#s-run").bounding_box()
    assert panel["x"] > form["x"] + form["width"] - 5  # beside the form, not above or under it
    page.screenshot(path=str(CREATE_SCREENSHOT))
    # More groups in flight and a wider bound: generation runs further ahead.
    page.fill("[id='f-actor.groups_in_flight']", "32")
    page.fill("[id='f-actor.max_lag']", "6")
    assert float(wait_for_mean(page, before)) > float(before)
    # Scrolled to the actor's fields, the panel is still in view and covers none of them.
    panel = page.locator("#lag-panel").bounding_box()
    field = page.locator("[id='f-actor.max_lag']").bounding_box()
    assert 0 <= panel["y"] < 1000 and panel["x"] > page.locator("form[data-panel='form']").bounding_box()["x"] + 100
    for box in [page.locator(f"[id='{i}']").bounding_box() for i in page.eval_on_selector_all(
            "form[data-panel='form'] .field input, form[data-panel='form'] .field select", "els => els.map(e => e.id)")]:
        if box and box["width"] > 0:
            assert box["x"] + box["width"] <= panel["x"] or box["y"] + box["height"] <= panel["y"] or box["y"] >= panel["y"] + panel["height"]
    assert field is not None
    page.screenshot(path=str(CREATE_EDITED_SCREENSHOT))
    page.reload()
    wait_for_mean(page, "…")
    assert page.locator(".lag-bar").count() == 9
