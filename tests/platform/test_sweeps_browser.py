"""In a real browser (Debian chromium, Playwright) against Daphne on the test database: a sweep of
three seeds (one failed part-way) compared as a group against a single run — one mean curve with a
band per group, the band's kind said on the chart and kept in the address across a reload — the run
list's sweep row folding its runs, and the create page's Sweep panel."""

from __future__ import annotations

import re
from typing import Any, Callable

import pytest
from django.utils import timezone

from inflight.runs import services, sweeps
from inflight.runs.models import Run, RunStatus
from inflight.live import ingest as live_ingest
from tests.platform.test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server, playwright_session  # noqa: F401 (fixture)
from tests.platform.test_run_actions_browser import sign_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def _log(run: Run, slope: float, steps: int) -> None:
    points = []
    for step in range(1, steps + 1):
        points.append(live_ingest.PointIn(line=2 * step, name="success/mean", step=step, t=1000.0 + 3 * step, value=min(1.0, 0.1 + slope * step)))
        if step % 4 == 0:
            points.append(live_ingest.PointIn(line=2 * step + 1, name="success/heldout", step=step, t=1000.5 + 3 * step, value=min(1.0, 0.1 + slope * step)))
    live_ingest.ingest_metrics(run.pk, points)


def _traces(page: Any) -> list[dict[str, Any]]:
    return page.evaluate("() => Array.from(document.querySelectorAll('.chart-card .plot'))[0].data.map(t => ({name: t.name, fill: t.fill || '', n: t.x.length}))")


def test_group_compare_with_bands_run_list_row_and_sweep_panel(daphne_server: str, owner, tiny_config: dict, settings,  # noqa: F811
                                                               wait: Callable[..., Any]) -> None:
    settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER = 10
    group = sweeps.create_sweep(owner, "lr-3e-4", {**tiny_config, "trainer": {**tiny_config["trainer"], "max_steps": 24}}, {"trainer.lr": [3e-4]}, 3)
    members = list(group.runs.order_by("id"))
    for run, slope, steps in zip(members, (0.03, 0.035, 0.025), (24, 24, 10)):
        _log(run, slope, steps)
    Run.objects.filter(pk__in=[run.pk for run in members[:2]]).update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    Run.objects.filter(pk=members[2].pk).update(status=RunStatus.FAILED, error="trainer exited 1", finished_at=timezone.now())
    single = services.create_run(owner, "baseline", {**tiny_config, "name": "baseline"})
    _log(single, 0.015, 24)
    Run.objects.filter(pk=single.pk).update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())

    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1500})
            page.set_default_timeout(60_000)
            sign_in(page, daphne_server, "owner", "owner-password-1", f"/compare/?groups={group.pk}&runs={single.pk}&metrics=success/mean")
            page.wait_for_selector(".chart-card .main-svg")
            title = page.locator(".chart-card h3").first.inner_text()
            assert "mean per group" in title and "min–max" in title
            traces = _traces(page)
            # Per group: the band's low and high edge (filled between) and the mean line.
            names = [trace["name"] for trace in traces]
            assert "lr-3e-4 (n=3, 1 failed: partial)" in names and f"#{single.pk} baseline (n=1)" in names
            assert sum(trace["fill"] == "tonexty" for trace in traces) == 2
            assert "1 failed (partial curve included)" in page.locator("#compare-groups").inner_text()
            sweep_row = page.locator(f'#time-to-target-groups tr[data-group="g{group.pk}"]').inner_text()
            assert "2 of 3" in sweep_row  # +0.20: steps 12 and 12; the failed run stopped at step 10, short of it
            page.screenshot(path="/tmp/compare_groups.png", full_page=True)

            page.check('#compare-groups input[name="band"][value="sd"]')
            wait(lambda: "band=sd" in page.url, timeout=10, message="the band in the address")
            assert "± 1 sd" in page.locator(".chart-card h3").first.inner_text()
            page.reload()
            page.wait_for_selector(".chart-card .main-svg")
            assert page.locator('#compare-groups input[name="band"][value="sd"]').is_checked()
            assert "± 1 sd" in page.locator(".chart-card h3").first.inner_text()
            assert sum(trace["fill"] == "tonexty" for trace in _traces(page)) == 2
            page.screenshot(path="/tmp/compare_groups_sd_reloaded.png", full_page=True)
            # A new target keeps the view (band, metrics) as it is now.
            page.fill('#time-to-target input[name="target"]', "0.5")
            page.click("#time-to-target button[type=submit]")
            wait(lambda: "target=0.5" in page.url, timeout=20, message="the target in the address")
            page.wait_for_selector(".chart-card .main-svg")
            assert "band=sd" in page.url and page.locator('#compare-groups input[name="band"][value="sd"]').is_checked()
            reached = page.locator(f'#time-to-target-groups tr[data-group="g{group.pk}"]').inner_text()
            assert "2 of 3" in reached and "14 ± 2.83" in reached  # 0.5 at steps 16 and 12; the failed run stopped short

            # The leaderboard: time to target per run, the target set on the page and kept on reload.
            page.goto(f"{daphne_server}/leaderboard/")
            page.fill('#target-form input[name="target"]', "0.5")
            page.click("#target-form button[type=submit]")
            page.wait_for_url(re.compile(r".*target=0\.5.*"))
            page.reload()
            assert page.input_value('#target-form input[name="target"]') == "0.5"
            assert page.locator(f'tr[data-run-id="{members[1].pk}"] [data-column="to_target_steps"]').inner_text() == "12"
            assert page.locator(f'tr[data-run-id="{members[2].pk}"] [data-column="to_target_wall"]').inner_text() == "not reached"
            # The sweep in one line (the recipe's row), at the same target, its name opening its group compare.
            sweep_line = page.locator(f'#leaderboard-sweeps tr[data-sweep-id="{group.pk}"]').inner_text()
            assert "2 of 3" in sweep_line and "(1 failed)" in sweep_line and "14 ± 2.83" in sweep_line
            page.screenshot(path="/tmp/leaderboard_to_target.png", full_page=True)
            page.click(f'#leaderboard-sweeps tr[data-sweep-id="{group.pk}"] a')
            page.wait_for_selector(".chart-card .main-svg")
            assert f"groups={group.pk}" in page.url and "target=0.5" in page.url

            # The run list: the sweep is one row; its runs open under it.
            page.goto(f"{daphne_server}/")
            row = page.locator(f'tr.group-row[data-group-id="{group.pk}"]')
            assert "3 runs" in row.inner_text() and "1 failed" in row.inner_text() and "2 succeeded" in row.inner_text()
            assert not page.locator(f'tr[data-run-id="{members[0].pk}"]').is_visible()
            row.locator("[data-group-toggle]").click()
            assert page.locator(f'tr[data-run-id="{members[0].pk}"]').is_visible()
            page.screenshot(path="/tmp/run_list_sweep.png", full_page=False)

            # The create page's Sweep panel launches a sweep.
            page.goto(f"{daphne_server}/runs/new/?preset=tiny-cpu")
            page.check("#sweep-on")
            assert page.inner_text("#launch-form") == "Launch sweep"
            page.fill('input[name="sweep_name"]', "from-the-form")
            page.fill('input[name="sweep_seeds"]', "2")
            page.locator('input[name="grid_key"]').first.fill("trainer.lr")
            page.locator('input[name="grid_values"]').first.fill("1e-4, 3e-4")
            page.click("#sweep-add-row")
            assert page.locator('input[name="grid_key"]').count() == 4
            page.locator("#s-sweep").screenshot(path="/tmp/create_sweep_panel.png")
            page.click("#launch-form")
            page.wait_for_url(re.compile(rf"{re.escape(daphne_server)}/$"))
            assert "from-the-form" in page.locator(".group-row").first.inner_text()
            page.screenshot(path="/tmp/run_list_after_sweep.png", full_page=False)
        finally:
            browser.close()
    made = Run.objects.filter(group__name="from-the-form")
    assert made.count() + len(made.first().group.waiting) == 4
