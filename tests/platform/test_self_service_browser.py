"""Issue 33 in Chromium: the first-day pages a user reaches without an operator — password reset
from the sign-in page, their API tokens, their datasets (a refused file names its bad lines), the
inbox across runs, the webhook test, and a run page that says what ran it and where the time goes
per process. Screenshots: tests/platform/screenshots.py (docs/screenshots/ when asked, for the README)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from inflight.alerts import services as alerts
from inflight.alerts.models import AlertWebhook
from inflight.runs import services as runs
from tests.platform.test_alerts import Receiver, lines
from tests.platform.test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - fixtures used by name
from tests.platform.test_datasets import BAD, GOOD, dataset_roots  # noqa: F401 - the autouse fixture: this test's datasets folder
from tests.platform.test_first_hour_browser import curve, make_run, screenshot
from tests.platform.test_provenance import launched
from workers.tasks import PlatformReporter

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)")]


def test_password_reset_from_the_sign_in_page(daphne_server: str, owner, browser, tmp_path: Path) -> None:
    owner.email = "owner@example.com"
    owner.save()
    page = browser.new_page()
    page.goto(f"{daphne_server}/accounts/login/")
    page.click("#forgot-password")
    page.fill("#id_email", "owner@example.com")
    page.click("#password-reset-form button[type=submit]")
    page.wait_for_selector("#password-reset-done")
    # The console mail backend (no SMTP configured) printed the mail to the server's log.
    link = re.search(r"http://127\.0\.0\.1:\d+/accounts/reset/\S+/", (tmp_path / "daphne.log").read_text()).group(0)
    page.goto(link)
    page.fill("#id_new_password1", "a-new-password-42")
    page.fill("#id_new_password2", "a-new-password-42")
    page.click("#password-set-form button[type=submit]")
    page.wait_for_selector("#password-reset-complete")
    page.goto(link)
    assert "This link no longer works" in page.content()  # used once
    page.goto(f"{daphne_server}/accounts/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "a-new-password-42")
    page.click("button[type=submit]")
    page.wait_for_selector("#nav-account")


def test_tokens_datasets_inbox_and_webhook_test(daphne_server: str, owner, browser, tmp_path: Path, django_capture_on_commit_callbacks) -> None:
    page = signed_in_page(browser, daphne_server, "/")
    page.click("#nav-account")
    page.fill("#id_name", "laptop")
    page.click("#token-form button[type=submit]")
    key = page.inner_text("#new-token-key").strip()
    assert re.fullmatch(r"[0-9a-f]{40}", key) and f"--token {key}" in page.inner_text("#new-token")
    screenshot(page, "account_tokens.png", full_page=True)
    page.reload()
    assert page.locator("#new-token-key").count() == 0  # shown once
    assert page.locator("#token-table tr[data-token-id]").count() == 1
    page.click("#token-table button:has-text('Revoke')")
    assert "revoked" in page.inner_text(".messages") and page.locator("#token-table tr[data-token-id]").count() == 0

    # Datasets: a refused file lists its bad lines; a good one is listed with its path.
    (tmp_path / "bad.jsonl").write_bytes(BAD)
    (tmp_path / "arith.jsonl").write_bytes(GOOD)
    page.click("text=Datasets")
    page.fill("#id_upload-name", "arith")
    page.set_input_files("#id_upload-file", str(tmp_path / "bad.jsonl"))
    page.click("#upload-form button[type=submit]")
    errors = page.inner_text("#upload-form .dataset-errors")
    assert "line 2: row has no 'answer'" in errors and "line 5: row has no 'problem' text" in errors
    page.set_input_files("#id_upload-file", str(tmp_path / "arith.jsonl"))
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("tr[data-dataset='arith']")
    assert page.inner_text("tr[data-dataset='arith'] .dataset-path").endswith(f"/{owner.pk}/arith.jsonl")
    page.fill("#id_upload-name", "broken")
    page.set_input_files("#id_upload-file", str(tmp_path / "bad.jsonl"))
    page.click("#upload-form button[type=submit]")
    screenshot(page, "datasets.png", full_page=True)

    # The inbox: alerts of two runs and a run's end, across runs; mark all read.
    first, second = make_run(owner, "lr-3e-4", status="running"), make_run(owner, "lr-1e-3", status="running")
    with django_capture_on_commit_callbacks(execute=True):
        alerts.evaluate_metric_lines(first.pk, lines(0, {"step": 12, "nonfinite/train/loss": 1.0}))
        alerts.evaluate_metric_lines(second.pk, lines(0, {"step": 7, "nonfinite/train/grad_norm": 1.0}))
        runs.finish_run(first.pk, "failed", "trainer exited with code 1")
        runs.finish_run(second.pk, "succeeded")
    page.goto(f"{daphne_server}/inbox/")
    assert page.inner_text("#nav-inbox .badge") == "4"
    assert page.locator("#inbox-table tr[data-unread='1']").count() == 4
    screenshot(page, "inbox.png", full_page=True)
    page.click("#mark-all-read")
    assert page.locator("#inbox-table tr[data-unread='1']").count() == 0 and page.locator("#nav-inbox .badge").count() == 0

    # The webhook's test button says what the receiver answered.
    receiver = Receiver()
    try:
        AlertWebhook.objects.create(user=owner, url=receiver.url)
        page.goto(f"{daphne_server}/settings/alerts/")
        page.click("#webhook-test-form button[type=submit]")
        assert "the webhook answered 200" in page.inner_text(".messages")
        assert receiver.wait_for(1)[0]["inflight"]["event"] == "test"
    finally:
        receiver.server.shutdown()


def test_run_page_says_what_ran_it_and_charts_each_process(daphne_server: str, owner, browser) -> None:
    roles = {"trainer": 95.0, "server0": 60.0, "actor": 30.0}
    series: dict[str, Any] = {}
    for role, cpu in roles.items():
        series[f"system__proc__{role}__cpu_percent"] = (lambda c: lambda s: c + (s % 5))(cpu)
        series[f"system__proc__{role}__rss_mb"] = (lambda c: lambda s: 10 * c + s)(cpu)
    run = make_run(owner, "tiny-cpu", records=curve(30, train__reward_mean=lambda s: s / 40, **series))
    folder_run = launched(owner, "recorded")  # a run directory with a provenance record...
    PlatformReporter(folder_run.pk).running(1)
    from inflight.provenance.models import RunProvenance

    stored = RunProvenance.objects.get(run=folder_run)
    # The command as the worker starts the engine (this record was made by the test process itself).
    stored.launches[-1]["command"] = ["/srv/inflight/.venv/bin/python", "-m", "rl_core", "run", f"var/runs/{run.pk}/submitted_config.yaml", "--out", f"var/runs/{run.pk}"]
    RunProvenance.objects.create(run=run, launches=stored.launches)  # ...which the charted run takes
    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1500)
    page.wait_for_selector("#chart-proc_cpu .main-svg")
    names = page.evaluate("() => document.querySelector('#chart-proc_cpu .plot').data.map(t => t.name)")
    assert all(any(role in name for name in names) for role in roles), names
    page.wait_for_selector("#chart-proc_mem .main-svg")
    assert f"-m rl_core run var/runs/{run.pk}/submitted_config.yaml" in page.inner_text("#provenance") and page.inner_text("#provenance-code")
    page.locator("#chart-proc_cpu").scroll_into_view_if_needed()
    screenshot(page, "run_page_processes.png")
    page.locator("#provenance").scroll_into_view_if_needed()
    screenshot(page, "run_page_provenance.png")
