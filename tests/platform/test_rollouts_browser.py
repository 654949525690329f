"""The rollout viewer and alerts in a real browser (Debian chromium + Playwright) against real
Daphne, Celery, PostgreSQL and Redis, with the real engine on the tiny model:

- a shortened demo run: its Rollouts tab fills while the run goes (rows arrive over the run's
  socket, no reload), a sample that spans two policy versions shows two colours and where the
  weights switched, the trainer's logprobs reach it and its importance-ratio colouring turns on,
  a filter narrows the table;
- a run made to diverge (lr 1e18: NaN loss at its second step): the alert banner rises within
  seconds of the alert, and a local HTTP receiver (the user's webhook) gets exactly one POST.
- samples that were not trained (issue 35 §3: a dropped zero-advantage group, an aborted response,
  a sample the trainer dropped as stale), stored as the worker stores them: each row has its reason
  as a badge, the counts say how many of each, and the filter shows trained / discarded / one reason.
Screenshots: /tmp/rollouts_tab.png, /tmp/sample_view.png, /tmp/sample_view_ratio.png, /tmp/alert_banner.png,
/tmp/rollouts_discarded.png, /tmp/rollouts_discarded_filtered.png,
/tmp/rollouts_discarded_sample.png.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from test_alerts import Receiver  # noqa: E402 - sibling test module (tests/platform is on sys.path)
from test_browser import CHROMIUM, CHROMIUM_ARGS, browser, daphne_server, signed_in_page  # noqa: F401 - fixtures used by name

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def demo_config(**overrides: Any) -> dict[str, Any]:
    config = yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text())
    config["trainer"].update(samples_per_step=8, max_steps=400, warmup_steps=2)
    config["actor"].update(group_size=4, groups_in_flight=3)
    config["task"]["heldout_size"] = 8
    config["max_wall_time_s"] = 240
    config["monitoring"] = {"rollouts": {"keep_every_n_steps": 1}}
    for dotted, value in overrides.items():
        node = config
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config


@pytest.mark.slow
def test_rollouts_fill_live_and_a_nan_run_alerts(daphne_server: str, start_worker, owner, tiny_model: Path, wait: Callable[..., Any]) -> None:
    from tests.platform.test_browser import playwright_session

    from inflight.accounts.services import create_token
    from inflight.alerts.models import AlertWebhook
    from inflight.runs import services

    receiver = Receiver()
    AlertWebhook.objects.create(user=owner, url=receiver.url)
    token = create_token(owner).key
    api = httpx.Client(base_url=daphne_server, headers={"Authorization": f"Token {token}"}, timeout=30)
    start_worker("cpu")
    run = services.create_run(owner, "viewer-demo", demo_config())
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1200})
            page.set_default_timeout(60_000)
            page.goto(f"{daphne_server}/accounts/login/?next=/runs/{run.pk}/%23rollouts")
            page.fill("#id_username", "owner")
            page.fill("#id_password", "owner-password-1")
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(rf".*/runs/{run.pk}/.*"))
            page.click("#rollouts-tab")
            rows = page.locator("#rollouts-body tr.rollout-row")

            # The table fills while the run goes, without a reload: rows come over the socket.
            wait(lambda: rows.count() > 0, timeout=240, interval=1, message="the first rollouts on the page")
            first = rows.count()
            wait(lambda: rows.count() > first, timeout=120, interval=1, message="more rollouts arriving live")
            newest = int(rows.first.get_attribute("data-step"))
            assert newest >= int(rows.last.get_attribute("data-step"))  # newest first
            page.screenshot(path="/tmp/rollouts_tab.png", full_page=False)

            # A sample that spans an in-flight weight update: two colours, and the switch marked.
            # One with a gradient: the trainer does not compute zero-advantage samples, so those
            # never get ratios (the viewer says why: ratios_missing).
            def spanning_id() -> str | None:
                found = api.get(f"/api/runs/{run.pk}/rollouts/", params={"limit": 500}).json()["rollouts"]
                for row in [r for r in found if r["versions_spanned"] >= 2][:20]:
                    if api.get(f"/api/runs/{run.pk}/rollouts/{row['id']}/").json()["advantage"] != 0.0:
                        return str(row["id"])
                return None

            wait(lambda: spanning_id() is not None, timeout=240, interval=2, message="a rollout that spans two policy versions")
            sample_id = spanning_id()
            # The trainer's logprobs of that sample (train_logprobs.jsonl) attach once its step is trained.
            detail_url = f"/api/runs/{run.pk}/rollouts/{sample_id}/"
            wait(lambda: api.get(detail_url).json()["ratios"] is not None, timeout=180, interval=2,
                 message="the trainer's logprobs of that sample")
            ratios = sorted(api.get(detail_url).json()["ratios"])
            # Trained at most max_lag versions after sampling, at a small LR: the policies are close.
            assert all(r > 0 for r in ratios) and 0.5 < ratios[len(ratios) // 2] < 2.0, ratios
            assert api.post(f"/api/runs/{run.pk}/cancel/").status_code == 200  # seen enough: free the CPU
            # Narrow the table to that sample's step (the filter form), then open it like a user.
            step = api.get(f"/api/runs/{run.pk}/rollouts/{sample_id}/").json()["step"]
            page.fill('input[name="step_min"]', str(step))
            page.fill('input[name="step_max"]', str(step))
            page.click("#rollout-filters button[type=submit]")
            page.locator(f'#rollouts-body tr[data-id="{sample_id}"]').click()
            page.wait_for_selector("#sample-view:not(.hidden) .tok")
            legend = page.locator("#sample-legend .legend-item")
            assert legend.count() >= 2
            colours = set(page.eval_on_selector_all("#sample-tokens .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)"))
            assert len(colours) >= 2, colours
            assert page.locator("#sample-tokens .tok.tok-switch").count() >= 1
            page.screenshot(path="/tmp/sample_view.png", full_page=False)
            # The importance-ratio toggle is live for it and colours every token.
            assert page.locator("#colour-ratio").is_enabled()
            page.check("#colour-ratio")
            ratio_colours = page.eval_on_selector_all("#sample-tokens .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)")
            assert ratio_colours and all(c not in ("rgba(0, 0, 0, 0)", "transparent") for c in ratio_colours), ratio_colours
            assert "ratio" in page.locator("#sample-legend").inner_text()
            page.screenshot(path="/tmp/sample_view_ratio.png", full_page=False)
            page.check('input[name="colour"][value="version"]')
            page.click("#sample-group")
            page.wait_for_selector("#sample-group-view:not(.hidden) tr.rollout-row")
            page.click("#sample-close")

            # A filter narrows the table.
            page.reload()
            page.click("#rollouts-tab")
            wait(lambda: rows.count() > 0, timeout=30, interval=0.5, message="rows after a reload")
            steps = [int(s) for s in page.eval_on_selector_all("#rollouts-body tr.rollout-row", "els => els.map(e => e.dataset.step)")]
            cut = sorted(set(steps))[len(set(steps)) // 2]
            before = rows.count()
            page.fill('input[name="step_min"]', str(cut))
            page.select_option('select[name="correct"]', "true")
            page.click("#rollout-filters button[type=submit]")
            wait(lambda: rows.count() < before, timeout=15, interval=0.2, message="the filter to narrow the table")
            shown = page.eval_on_selector_all("#rollouts-body tr.rollout-row", "els => els.map(e => [Number(e.dataset.step), e.dataset.correct])")
            assert all(step >= cut and correct == "1" for step, correct in shown), shown

            # A run made to diverge: NaN loss at its second step → banner within seconds + one webhook POST.
            created = api.post("/api/runs/", json={"name": "nan-run", "config": demo_config(**{
                # 1e18: Adam's first step puts the weights near 1e18, the next forward is NaN. (Not
                # larger: PostgreSQL's jsonb prints numbers without an exponent, so a stored 1e30
                # comes back as an integer past the platform's 64-bit bound and is refused.)
                "trainer.lr": 1e18, "trainer.warmup_steps": 0, "monitoring.alerts.stall_s": 600})})
            assert created.status_code == 201, created.text
            nan_id = created.json()["id"]
            page.goto(f"{daphne_server}/runs/{nan_id}/")

            def nonfinite_alert() -> dict[str, Any] | None:
                found = [a for a in api.get(f"/api/runs/{nan_id}/alerts/").json()["alerts"] if a["rule"] == "nonfinite"]
                return found[0] if found else None

            wait(lambda: nonfinite_alert() is not None, timeout=300, interval=0.25, message="the non-finite loss alert")
            stored_at = time.monotonic()
            page.wait_for_selector("#alert-banner:not(.hidden)", timeout=10_000)
            banner_s = time.monotonic() - stored_at
            assert "non-finite" in page.locator("#alert-banner").inner_text()
            assert page.locator('#alert-list li[data-rule="nonfinite"]').count() == 1
            page.screenshot(path="/tmp/alert_banner.png", full_page=False)
            posts = [b for b in receiver.wait_for(1) if b["inflight"].get("run") == nan_id and b["inflight"].get("rule") == "nonfinite"]  # run-end notices carry no rule
            time.sleep(2.0)  # more NaN steps may follow: still one POST for the episode
            posts = [b for b in receiver.bodies if b["inflight"].get("run") == nan_id and b["inflight"].get("rule") == "nonfinite"]  # run-end notices carry no rule
            assert len(posts) == 1 and "non-finite" in posts[0]["text"], receiver.bodies
            print(f"alert banner {banner_s:.2f} s after the alert was stored")
            page.goto(f"{daphne_server}/")
            assert page.locator(f'[data-alerts-of="{nan_id}"]').is_visible()
        finally:
            browser.close()
            receiver.server.shutdown()
            api.close()


def test_discarded_samples_show_their_reason_counts_and_filter(daphne_server: str, owner, browser, wait: Callable[..., Any]) -> None:  # noqa: F811
    from test_rollouts import DECODER, discarded_sample, make_run, sample

    from inflight.rollouts.models import StoredRollout
    from inflight.rollouts.services import attach_train_logprobs, ingest_rollouts

    run = make_run(owner, samples_per_step=4)
    ingest_rollouts(run.pk, [(line, sample(line, reward=float(line % 2))) for line in range(12)], DECODER)
    ingest_rollouts(run.pk, [(0, discarded_sample(4, "zero_advantage", 0)), (1, discarded_sample(4, "zero_advantage", 1)),
                             (2, discarded_sample(10, "aborted", 0))], DECODER, discarded=True)
    attach_train_logprobs(run.pk, [{"sample_id": "g4-1", "step": 3, "consumed": 12, "discarded": "stale"}])
    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1000)
    page.click("#rollouts-tab")
    rows = page.locator("#rollouts-body tr.rollout-row")
    page.wait_for_selector("#rollouts-body tr.rollout-row")
    assert rows.count() == 15
    assert page.locator("#rollouts-counts").inner_text() == "trained 11 · discarded 4 (aborted 1, stale 1, zero advantage 2)"
    badges = page.eval_on_selector_all("#rollouts-body tr.rollout-row.discarded .discard-badge", "els => els.map(e => e.dataset.reason)")
    assert sorted(badges) == ["aborted", "stale", "zero_advantage", "zero_advantage"], badges
    assert "all equal" in page.locator('.discard-badge[data-reason="zero_advantage"]').first.get_attribute("title")
    assert page.locator("#rollouts-body tr.rollout-row:not(.discarded) .discard-badge").count() == 0
    page.locator("#rollouts-panel").scroll_into_view_if_needed()
    page.screenshot(path="/tmp/rollouts_discarded.png", full_page=False)

    # While the page is open, the worker stores another batch with a discarded sample: the row comes
    # live, and the counts follow (a new reason gets its filter choice) without a reload.
    from inflight.live import broadcast

    ingest_rollouts(run.pk, [(3, discarded_sample(8, "empty", 0))], DECODER, discarded=True)
    broadcast.flush_broadcasts()
    wait(lambda: rows.count() == 16, timeout=15, interval=0.2, message="the pushed discarded row")
    wait(lambda: page.locator("#rollouts-counts").inner_text() == "trained 11 · discarded 5 (aborted 1, empty 1, stale 1, zero advantage 2)",
         timeout=15, interval=0.2, message="the counts after the push")

    # The filter: trained only, discarded only, one reason (its choice added from the counts).
    options = page.eval_on_selector_all('select[name="discarded"] option', "els => els.map(e => e.value)")
    assert options == ["", "false", "true", "aborted", "stale", "zero_advantage", "empty"], options
    page.select_option('select[name="discarded"]', "false")
    page.click("#rollout-filters button[type=submit]")
    wait(lambda: rows.count() == 11, timeout=15, interval=0.2, message="11 rows after filtering")
    assert page.locator("#rollouts-body tr.rollout-row.discarded").count() == 0
    page.select_option('select[name="discarded"]', "true")
    page.click("#rollout-filters button[type=submit]")
    wait(lambda: rows.count() == 5, timeout=15, interval=0.2, message="5 rows after filtering")
    page.select_option('select[name="discarded"]', "zero_advantage")
    page.click("#rollout-filters button[type=submit]")
    wait(lambda: rows.count() == 2, timeout=15, interval=0.2, message="2 rows after filtering")
    assert set(page.eval_on_selector_all("#rollouts-body tr.rollout-row", "els => els.map(e => e.dataset.discarded)")) == {"zero_advantage"}
    page.screenshot(path="/tmp/rollouts_discarded_filtered.png", full_page=False)

    # The sample view says why it was not trained; its group lists its discarded siblings.
    dropped = StoredRollout.objects.get(run=run, sample_id="d4-0")
    page.locator(f'#rollouts-body tr[data-id="{dropped.pk}"]').click()
    page.wait_for_selector("#sample-view:not(.hidden) .tok")
    assert "discarded (zero advantage): not trained" in page.locator("#sample-meta").inner_text()
    page.click("#sample-group")
    page.wait_for_selector("#sample-group-view:not(.hidden) tr.rollout-row")
    assert page.locator("#sample-group-view tr.rollout-row.discarded .discard-badge").count() == 2
    page.screenshot(path="/tmp/rollouts_discarded_sample.png", full_page=False)
