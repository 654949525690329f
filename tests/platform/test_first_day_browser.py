"""Issue 33 in a real browser (Debian's chromium through Playwright, a real Daphne on the test
PostgreSQL and Redis): the create page's Form and YAML tabs are one config, compare follows its
runs live, the run list sorts by its metric columns and its sparklines move, unknown addresses
get the site's 404 page. Runs are made in the database as the worker leaves them
(test_first_hour_browser.make_run). Screenshots: tests/platform/screenshots.py (docs/screenshots/ when asked).
"""

from __future__ import annotations
from inflight.live import ingest as live_ingest

import re
from pathlib import Path
from typing import Any, Callable

import pytest

from test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - the fixtures are used by name

REPO_ROOT = Path(__file__).resolve().parents[2]
from tests.platform.screenshots import SCREENSHOTS  # noqa: E402  (docs/screenshots/ only when asked)
RUN_PAGE = re.compile(r"/runs/\d+/$")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def test_form_and_yaml_tabs_are_one_config(daphne_server: str, browser: Any, owner, wait: Callable[..., Any]) -> None:  # noqa: F811
    from inflight.runs.models import Run

    page = signed_in_page(browser, daphne_server, "/runs/new/")
    # Edits on the form show on the YAML tab ...
    page.fill("#f-name", "x")
    page.fill('[id="f-trainer.max_steps"]', "12")
    page.click('.tab[data-tab="yaml"]')
    wait(lambda: "max_steps: 12" in page.input_value("textarea[name=config_yaml]"), timeout=10, message="the form's edits on the YAML tab")
    text = page.input_value("textarea[name=config_yaml]")
    assert text.startswith("name: x\n"), text[:200]
    page.screenshot(path=str(SCREENSHOTS / "create_page_yaml.png"), full_page=False)
    # ... and launching from the YAML tab launches them (it launched "tiny-cpu", 100 steps).
    page.click('form[data-panel="yaml"] button[type=submit]')
    page.wait_for_url(RUN_PAGE, timeout=30_000)
    run = Run.objects.order_by("-id").first()
    assert run.name == "x" and run.config["trainer"]["max_steps"] == 12

    # Edits on the YAML tab show on the form, and the form launches them.
    page.goto(f"{daphne_server}/runs/new/")
    page.click('.tab[data-tab="yaml"]')
    yaml_text = page.input_value("textarea[name=config_yaml]").replace("name: tiny-cpu", "name: y").replace("max_steps: 100", "max_steps: 7")
    page.fill("textarea[name=config_yaml]", yaml_text)
    page.click('.tab[data-tab="form"]')
    wait(lambda: page.input_value('[id="f-trainer.max_steps"]') == "7", timeout=10, message="the YAML's edit on the form")
    assert page.input_value("#f-name") == "y"
    page.screenshot(path=str(SCREENSHOTS / "create_page_form.png"), full_page=False)
    page.click("#launch-form")
    page.wait_for_url(RUN_PAGE, timeout=30_000)
    run = Run.objects.order_by("-id").first()
    assert run.name == "y" and run.config["trainer"]["max_steps"] == 7

    # What the form cannot show is said, and the form cannot drop it.
    page.goto(f"{daphne_server}/runs/new/")
    page.click('.tab[data-tab="yaml"]')
    page.fill("textarea[name=config_yaml]", "# my sweep\nname: z\nsurprise: 1\n")
    page.click('.tab[data-tab="form"]')
    page.wait_for_selector("#form-unshown:not(.hidden)", timeout=10_000)
    said = page.inner_text("#form-unshown")
    assert "surprise" in said and "1 comment line" in said, said
    assert page.is_disabled('[id="f-trainer.max_steps"]') and page.is_disabled("#launch-form")
    page.click('.tab[data-tab="yaml"]')
    assert page.input_value("textarea[name=config_yaml]") == "# my sweep\nname: z\nsurprise: 1\n"  # kept as typed
    page.close()


def test_a_late_answer_for_the_form_never_overwrites_what_was_typed_on_the_yaml_tab(daphne_server: str, browser: Any, owner, wait: Callable[..., Any]) -> None:  # noqa: F811
    page = signed_in_page(browser, daphne_server, "/runs/new/")
    held: list[Any] = []  # the form → YAML answer, held back as a slow server would

    def hold_form_to_yaml(route: Any) -> None:
        if not held and 'name="to"\r\n\r\nyaml' in (route.request.post_data or ""):
            held.append(route)
        else:
            route.continue_()

    page.route("**/runs/new/sync.json", hold_form_to_yaml)
    page.fill('[id="f-trainer.max_steps"]', "12")
    wait(lambda: page.wait_for_timeout(50) or held, timeout=10, message="the form's sync to be asked")
    page.click('.tab[data-tab="yaml"]')
    typed = page.input_value("textarea[name=config_yaml]").replace("max_steps: 100", "max_steps: 7")
    page.fill("textarea[name=config_yaml]", typed)
    held.pop().continue_()
    # The YAML typed after the form's edit is the newer edit: it stays, and the form follows it.
    wait(lambda: page.input_value('[id="f-trainer.max_steps"]') == "7", timeout=10, message="the YAML's edit on the form")
    assert page.input_value("textarea[name=config_yaml]") == typed
    page.close()


def test_unknown_addresses_get_the_sites_404_page(daphne_server: str, browser: Any, owner) -> None:  # noqa: F811
    page = signed_in_page(browser, daphne_server, "/")
    response = page.goto(f"{daphne_server}/runs/abc/")
    assert response.status == 404
    assert page.inner_text("h1") == "Not found" and "No page at /runs/abc/" in page.inner_text("#error-page")
    assert page.is_visible(".topbar nav") and page.is_visible("#error-page a[href='/']")  # the site's layout, a way back
    page.screenshot(path=str(SCREENSHOTS / "not_found.png"), full_page=False)
    page.close()


def test_the_run_list_sorts_by_its_figures_and_its_sparklines_move(daphne_server: str, browser: Any, owner, wait: Callable[..., Any]) -> None:  # noqa: F811
    from inflight.runs import services
    from test_first_hour_browser import curve, make_run

    figures = {"low": (0.3, 0.9, 0.5), "high": (0.8, 0.1, 0.2), "mid": (0.5, 0.5, 0.9)}
    for name, (heldout, reward, loss) in figures.items():
        make_run(owner, name, records=curve(20, success__heldout=lambda s, v=heldout: v if s % 5 == 0 else None,
                                            reward__mean=lambda s, v=reward: v, train__loss=lambda s, v=loss: v))
    live = make_run(owner, "live", status="running", records=curve(10, reward__mean=lambda s: 0.1 * (s % 3), train__loss=lambda s: 1.0))

    page = signed_in_page(browser, daphne_server, "/")

    def order() -> list[str]:
        return [name for name in page.eval_on_selector_all("#runs-table tbody tr td:nth-child(3) > a", "links => links.map(a => a.textContent)") if name != "live"]

    page.click("a[data-sort=heldout]")
    page.wait_for_url("**sort=-heldout**")
    assert order() == ["high", "mid", "low"]
    page.click("a[data-sort=heldout]")
    page.wait_for_url("**sort=heldout**")
    assert order() == ["low", "mid", "high"]
    page.click("a[data-sort=reward]")
    page.wait_for_url("**sort=-reward**")
    assert order() == ["low", "mid", "high"]
    page.goto(f"{daphne_server}/?sort=loss")
    assert order() == ["high", "low", "mid"]
    page.goto(f"{daphne_server}/?sort=-progress")
    assert page.inner_text("#runs-table tbody tr:first-child td:nth-child(3)").startswith(("low", "high", "mid"))  # 20 steps before 10

    # The live run's sparkline follows it (it was drawn once, at page load).
    page.goto(f"{daphne_server}/")
    cell = f'tr[data-run-id="{live.pk}"] [data-spark="reward/mean"]'
    before = page.inner_html(cell)
    points = [p for line, record in enumerate(curve(30, reward__mean=lambda s: 0.03 * s)[10:], start=100)
              for p in live_ingest.points_from_metrics_record(line, record)]
    live_ingest.ingest_metrics(live.pk, points)
    wait(lambda: page.inner_html(cell) != before, timeout=20, message="the sparkline to move")
    page.screenshot(path=str(SCREENSHOTS / "run_list_sorted.png"), full_page=False)
    page.close()


def test_compare_follows_its_runs_live(daphne_server: str, browser: Any, owner, wait: Callable[..., Any]) -> None:  # noqa: F811
    """Issue 33: a run without metrics when compare opened never appeared, its status stayed
    "starting". Now it is said to have no data yet, then its status and curves follow it."""
    from inflight.runs import services
    from test_first_hour_browser import curve, make_run

    done = make_run(owner, "done", records=curve(20, success__mean=lambda s: 0.02 * s, reward__mean=lambda s: 0.02 * s))
    fresh = make_run(owner, "fresh", status="queued")
    page = signed_in_page(browser, daphne_server, f"/compare/?runs={done.pk},{fresh.pk}&metrics=success/mean")
    page.wait_for_selector(f'[data-no-data-of="{fresh.pk}"]:not(.hidden)')
    assert page.is_hidden(f'[data-no-data-of="{done.pk}"]')

    def traces() -> list[str]:
        return page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(el => (el.data || []).map(t => t.name || ''))")

    wait(lambda: any(name.startswith(f"#{done.pk} ") for name in traces()), timeout=20, message="the finished run's curve")
    assert not any(name.startswith(f"#{fresh.pk} ") for name in traces())

    services.transition_run(fresh.pk, "starting")
    services.transition_run(fresh.pk, "running")
    wait(lambda: page.inner_text(f'#compare-runs [data-status-of="{fresh.pk}"]') == "running", timeout=20, message="the status to follow")
    points = [p for line, record in enumerate(curve(8, success__mean=lambda s: 0.1 * s)) for p in live_ingest.points_from_metrics_record(line, record)]
    live_ingest.ingest_metrics(fresh.pk, points)
    wait(lambda: any(name.startswith(f"#{fresh.pk} ") for name in traces()), timeout=30, message="the new run's curve on the open page")
    page.wait_for_selector(f'[data-no-data-of="{fresh.pk}"].hidden', state="attached")
    page.screenshot(path=str(SCREENSHOTS / "compare_live.png"), full_page=False)
    page.close()


def test_the_run_page_marks_what_the_run_set(daphne_server: str, browser: Any, owner) -> None:  # noqa: F811
    from test_first_hour_browser import make_run

    run = make_run(owner, "marked", **{"trainer.lr": 3e-4})
    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/")
    page.click("#run-config > summary")
    assert page.get_attribute('#config-view tr[data-path="trainer.lr"]', "class") == "config-set"
    assert page.get_attribute('#config-view tr[data-path="actor.max_lag"]', "class") == "config-default"
    page.check("#config-only-set")  # the defaults hidden: what this run chose, at a glance
    assert page.is_hidden('#config-view tr[data-path="actor.max_lag"]') and page.is_visible('#config-view tr[data-path="trainer.lr"]')
    page.locator("#run-config").screenshot(path=str(SCREENSHOTS / "run_page_config.png"))
    page.close()
