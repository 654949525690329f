"""/api/docs/ renders the API's operations in a real browser with every request kept on the
server (no CDN): Debian's chromium via Playwright against Daphne, which serves django-ninja's
vendored Swagger UI through the static files handler. Screenshot: /tmp/api_docs.png."""

from __future__ import annotations

from typing import Any

import pytest

from tests.platform.test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server, playwright_session  # noqa: F401 - the fixture is used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def test_docs_page_renders_offline_with_every_operation(daphne_server: str) -> None:  # noqa: F811

    requested: list[str] = []
    blocked: list[str] = []

    def only_this_server(route: Any) -> None:
        url = route.request.url
        requested.append(url)
        if url.startswith(daphne_server) or url.startswith("data:"):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1400})
            page.set_default_timeout(30_000)
            page.route("**/*", only_this_server)
            errors: list[str] = []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.goto(f"{daphne_server}/api/docs/")
            page.wait_for_selector(".swagger-ui .opblock")
            assert "Inflight API" in page.locator(".swagger-ui .info .title").inner_text()
            summaries = page.locator(".opblock-summary-path").all_inner_texts()
            paths = {text.replace("\u200b", "") for text in summaries}
            assert {"/api/runs/", "/api/runs/{run_id}/logs/{name}", "/api/runs/{run_id}/checkpoints/{step}/download/"} <= paths
            assert page.locator(".swagger-ui .btn.authorize").count() == 1  # the token goes in here
            page.screenshot(path="/tmp/api_docs.png", full_page=False)
        finally:
            browser.close()
    assert blocked == [], f"the docs page reached off the server: {blocked}"
    assert any(url.endswith("/api/openapi.json") for url in requested)
    assert not [text for text in errors if "Content Security Policy" in text], errors
