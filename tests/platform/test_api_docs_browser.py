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


def test_docs_page_shows_the_run_config_fields_with_their_help(daphne_server: str) -> None:  # noqa: F811
    """Creating a run: its body's `config` is the typed RunConfig, each field with its help text,
    and "Try it out" starts from a small example, not every default spelled out. Screenshot:
    /tmp/api_docs_run_config.png."""
    from rl_core.config.run_config import RunConfig, TrainerConfig

    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1600})
            page.set_default_timeout(120_000)  # the first request builds the document (seconds on a loaded machine)
            page.goto(f"{daphne_server}/api/docs/#/runs/inflight_api_run_actions_create_run")
            create = page.locator("#operations-runs-inflight_api_run_actions_create_run")
            create.wait_for()
            if not create.locator(".opblock-body").count():
                create.locator(".opblock-summary").click()
            body = create.locator(".opblock-section-request-body")
            assert '"max_steps": 20' in body.locator(".body-param__example, .highlight-code").first.inner_text()  # the example
            body.locator('button[data-name="model"]').click()  # the "Schema" tab
            model = body.locator(".model-box")
            model.get_by_text("config", exact=True).first.wait_for()
            # The body's "Expand all" opens every field, the config's sections and theirs included.
            deep = model.locator(".json-schema-2020-12-expand-deep-button").first
            if deep.inner_text().strip() == "Collapse all":
                deep.click()
            deep.click()
            page.get_by_text(RunConfig.model_fields["seed"].description).first.wait_for()
            page.get_by_text(TrainerConfig.model_fields["max_steps"].description).first.wait_for()
            text = model.inner_text()
            for field in ("trainer", "actor", "sampling", "eval"):
                assert field in text
            page.get_by_text(RunConfig.model_fields["seed"].description).first.scroll_into_view_if_needed()
            page.screenshot(path="/tmp/api_docs_run_config.png", full_page=False)
            page.reload()
            page.wait_for_selector(".swagger-ui .opblock")  # a reload renders it again
        finally:
            browser.close()
