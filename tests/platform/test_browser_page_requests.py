"""Issue 26.9 in Chromium against a real Daphne: no page asks for something that is not there
(a favicon 404 on every page before), and an unknown /api/ path answers the API's JSON error
(an HTML page before), as a browser or a script fetching it sees it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server  # noqa: F401 - the fixture is used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]

PAGES = ("/", "/runs/new/", "/compare/", "/leaderboard/", "/workers/", "/settings/alerts/")


def test_pages_load_everything_they_name_and_api_errors_are_json(daphne_server: str, owner) -> None:
    from tests.platform.test_browser import playwright_session

    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            failures: list[tuple[int, str]] = []
            page.on("response", lambda response: failures.append((response.status, response.url)) if response.status >= 400 else None)
            page.goto(f"{daphne_server}/accounts/login/")
            page.fill("#id_username", "owner")
            page.fill("#id_password", "owner-password-1")
            page.click("button[type=submit]")
            page.wait_for_load_state("networkidle")
            for path in PAGES:
                page.goto(f"{daphne_server}{path}")
                page.wait_for_load_state("networkidle")
                # The icon the page names is a real image (headless Chromium may not fetch it itself).
                icon: list[Any] = page.evaluate(
                    "fetch(document.querySelector('link[rel=icon]').href).then(r => [r.status, r.headers.get('content-type')])"
                )
                assert icon[0] == 200 and icon[1].startswith("image/"), (path, icon)
            assert failures == [], failures
            # What a browser asks for when a page names no icon.
            favicon = page.goto(f"{daphne_server}/favicon.ico")
            assert favicon is not None and favicon.status == 200 and favicon.headers["content-type"].startswith("image/")

            missing = page.goto(f"{daphne_server}/api/runs/1/no-such-thing/")
            assert missing is not None and missing.status == 404
            assert missing.headers["content-type"] == "application/json"
            assert json.loads(missing.text()) == {"error": "no API endpoint at /api/runs/1/no-such-thing/"}
        finally:
            browser.close()
