"""Long lists a page at a time, in a real browser (Debian chromium, Playwright, Daphne on the
test database): the run list's and the leaderboard's pagers keep the filters and the sort, and
the compare page fetches only the metrics it charts, fetching more when one is picked. A few
dozen runs here; the 2,000-run timings are bench/platform_scale.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from inflight.runs.models import Run
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest
from tests.platform.test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server, playwright_session, signed_in_page  # noqa: F401 (fixture)

# To look at (not shown in the README): the pagers under the tables.
SCREENSHOTS = Path("/tmp/inflight-pagination")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


@pytest.fixture
def page(daphne_server: str, owner) -> Iterator[Any]:  # noqa: F811
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield signed_in_page(browser, daphne_server, "/")
        finally:
            browser.close()


def _runs(owner, count: int) -> list[Run]:
    runs = Run.objects.bulk_create([
        Run(owner=owner, name=f"sweep-{i:02d}", config={"mode": "async", "trainer": {"max_steps": 4}}, status="succeeded", tags=["grid"] if i % 3 else [])
        for i in range(count)
    ])
    for i, run in enumerate(runs):
        live_ingest.ingest_metrics(run.pk, [
            PointIn(line=step, name=name, step=step, t=1000.0 + step, value=i / 100 + step / 1000)
            for step in range(1, 5) for name in ("success/mean", "reward/mean", "train/loss", "train/kl")
        ])
    return runs


def _row_ids(page: Any, table: str) -> list[int]:
    return [int(i) for i in page.eval_on_selector_all(f"#{table} tbody tr[data-run-id]", "rows => rows.map(r => r.dataset.runId)")]


def test_run_list_and_leaderboard_pagers_keep_filters_and_sort(daphne_server: str, owner, page) -> None:  # noqa: F811
    runs = _runs(owner, 80)
    tagged = [run for run in runs if run.tags]  # 53 runs: two pages of the tag's filter
    page.goto(f"{daphne_server}/?tag=grid&sort=name")
    assert _row_ids(page, "runs-table") == [run.pk for run in tagged[:50]]
    assert "1–50 of 53" in page.inner_text("#pager")
    page.click("#pager a[rel=next]")
    page.wait_for_load_state("networkidle")
    assert "tag=grid" in page.url and "sort=name" in page.url and "page=2" in page.url
    assert _row_ids(page, "runs-table") == [run.pk for run in tagged[50:]]
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "run_list_pager.png"), full_page=True)
    page.click("#pager a[rel=prev]")
    page.wait_for_load_state("networkidle")
    assert _row_ids(page, "runs-table")[0] == tagged[0].pk

    # Leaderboard: the best training batch first, over every page; page 2 holds the rest.
    page.goto(f"{daphne_server}/leaderboard/?sort=-success_best")
    best_first = sorted(runs, key=lambda run: -run.pk)  # higher index = higher success here
    assert _row_ids(page, "leaderboard") == [run.pk for run in best_first[:50]]
    page.click("#pager a[rel=next]")
    page.wait_for_load_state("networkidle")
    assert "sort=-success_best" in page.url
    assert _row_ids(page, "leaderboard") == [run.pk for run in best_first[50:]]
    assert "51–80 of 80" in page.inner_text("#pager")
    page.screenshot(path=str(SCREENSHOTS / "leaderboard_pager.png"), full_page=True)


def test_compare_fetches_only_the_charted_metrics(daphne_server: str, owner, page) -> None:  # noqa: F811
    runs = _runs(owner, 3)
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url) if "snapshot" in request.url else None)
    ids = ",".join(str(run.pk) for run in runs)
    page.goto(f"{daphne_server}/compare/?runs={ids}&metrics=train/loss")
    page.wait_for_selector("#charts .chart-card .main-svg")
    options = page.eval_on_selector_all("#metric-select option", "os => os.map(o => o.value)")
    assert options == ["reward/mean", "success/mean", "train/kl", "train/loss"]  # every logged metric, listed
    # One request for the three runs' snapshots (compare/snapshots.json), of the charted metric only.
    assert fetched == [f"{daphne_server}/compare/snapshots.json?runs={ids}&names=train%2Floss"], fetched
    # Picking one not fetched yet fetches the charted set, again in one request; both are drawn.
    fetched.clear()
    page.select_option("#metric-select", ["train/loss", "train/kl"])
    page.wait_for_selector("#charts .chart-card >> nth=1")
    page.wait_for_selector("#charts .chart-card:nth-child(2) .main-svg")
    assert len(fetched) == 1 and "compare/snapshots.json" in fetched[0] and "train%2Fkl" in fetched[0], fetched
    traces = page.evaluate("Array.from(document.querySelectorAll('#charts .js-plotly-plot')).map(p => p.data.filter(t => t.y && t.y.length).length)")
    assert len(traces) == 2 and all(count >= 3 for count in traces), traces
