"""The run page's live socket in a real browser (Debian chromium + Playwright) against real
Daphne and PostgreSQL, with the socket itself routed by Playwright so the test plays the server:
a socket that is accepted and at once closed (1011 while Redis is away) is retried after about 1,
2, 4, then 8 s, not every second; a connection that lasted is retried after about 1 s again; "not
yours" (4403) is never retried. The page's timers run on Playwright's fake clock, so the test
covers a minute and a half of back-off in a few seconds."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server  # noqa: F401 - the fixture is used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]

JITTER_MS = 500  # run_page.js adds up to this much to every delay
TICK_MS = 50
# A connection is noted at the end of the tick that opened it, so a measured gap is the real one
# to within one tick either way: each bound below is widened by one tick.


class PlayedServer:
    """Routes the page's run socket: notes when (on the page's fake clock) each connection
    comes, and closes it at once with `close_code`, or leaves it open when that is None."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.attempts: list[int] = []
        self.sockets: list[Any] = []
        self.close_code: int | None = 1011
        self.now_ms = 0

    def handle(self, socket: Any) -> None:
        self.attempts.append(self.now_ms)
        self.sockets.append(socket)
        if self.close_code is not None:
            socket.close(code=self.close_code, reason="played server")

    def advance(self, ms: int, until_attempts: int | None = None) -> None:
        """Run the page's clock `ms` further in ticks (stopping early once `until_attempts`
        connections came); a round trip per tick lets the route handler see what a tick started."""
        for _ in range(ms // TICK_MS):
            if until_attempts is not None and len(self.attempts) >= until_attempts:
                return
            # The clock moves before the tick runs: a connection the tick opens may reach `handle`
            # while run_for is still answering (a loaded machine), and must be noted at the tick's end.
            self.now_ms += TICK_MS
            self.page.clock.run_for(TICK_MS)
            self.page.evaluate("1")

    def live_text(self) -> str:
        return self.page.text_content("#live-text") or ""


def test_the_run_page_backs_off_while_its_socket_keeps_closing(daphne_server: str, owner, tiny_config: dict) -> None:
    from tests.platform.test_browser import playwright_session

    from inflight.runs import services

    run = services.create_run(owner, "queued-run", tiny_config)  # queued, no worker: the page keeps reconnecting
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            server = PlayedServer(page)
            page.goto(f"{daphne_server}/accounts/login/?next=/runs/{run.pk}/")
            page.fill("#id_username", "owner")
            page.fill("#id_password", "owner-password-1")
            # Paused: the page's time moves only by the test's ticks. A running fake clock also flows
            # with real time, so on a loaded machine (slow round trips) the page's timers fired
            # between ticks the test had not counted (CI-like run: a 1 s back-off measured as 900 ms).
            page.clock.install()
            page.clock.pause_at(int(time.time() * 1000) + 1000)
            page.route_web_socket(re.compile(rf".*/ws/runs/{run.pk}/$"), server.handle)
            page.click("button[type=submit]")
            page.wait_for_url(re.compile(rf".*/runs/{run.pk}/$"))
            for _ in range(100):
                if server.attempts and server.live_text() == "reconnecting":
                    break
                server.advance(TICK_MS)
            assert server.attempts and server.live_text() == "reconnecting"

            # Accepted and closed at once, again and again: ~1, ~2, ~4, ~8 s apart (never every second).
            server.advance(17_000 + 2 * TICK_MS)
            gaps = [b - a for a, b in zip(server.attempts, server.attempts[1:])]
            assert len(gaps) == 4, gaps
            for gap, base in zip(gaps, (1000, 2000, 4000, 8000)):
                assert base - TICK_MS <= gap <= base + JITTER_MS + TICK_MS, gaps

            # The next try (~16 s on) is left open; once it has lasted 10 s a close resets the back-off.
            server.close_code = None
            server.advance(17_000, until_attempts=6)
            assert len(server.attempts) == 6
            assert 16_000 - TICK_MS <= server.attempts[5] - server.attempts[4] <= 16_000 + JITTER_MS + TICK_MS
            server.advance(200)
            assert server.live_text() == "live"
            server.advance(11_000)
            server.close_code = 1011
            closed_at = server.now_ms
            server.sockets[-1].close(code=1011, reason="played server")
            server.advance(2_000, until_attempts=7)
            assert len(server.attempts) == 7
            assert 1000 - TICK_MS <= server.attempts[6] - closed_at <= 1000 + JITTER_MS + 2 * TICK_MS

            # "Not yours" is final: the next try (~2 s on) is refused, and nothing comes after it.
            server.close_code = 4403
            server.advance(60_000)
            assert len(server.attempts) == 8
            assert server.live_text() == "not allowed"
        finally:
            browser.close()
