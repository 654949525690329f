"""In Chromium against Daphne on the test database: an open run page's actions panel follows the
run by pushes, not by polling (issue 24). The page fetches panel.json once its socket opens and
then not again while nothing changes; a new checkpoint (the worker's `run.panel` push), an
evaluation score (`eval.score`) and a tag edit show up after their pushes; the wall time counts
on in the page every second meanwhile. A screenshot of the reloaded page goes to
/tmp/run_panel_push.png."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - the fixtures are used by name

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]

SCREENSHOT = Path("/tmp/run_panel_push.png")


def seconds_shown(text: str) -> int:
    """`1m 45s` / `45s` (the page's formatDuration below an hour) → seconds."""
    match = re.fullmatch(r"(?:(\d+)m )?(\d+)s", text.strip())
    assert match, text
    return int(match.group(1) or 0) * 60 + int(match.group(2))


def write_checkpoint(run_id: int, step: int, settings: Any) -> None:
    folder = Path(settings.INFLIGHT_RUNS_DIR) / str(run_id) / "checkpoints" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"t": time.time(), "version": step}))


def test_the_panel_follows_pushes_without_polling_and_the_wall_time_counts(daphne_server: str, owner, browser, tiny_config: dict, settings) -> None:  # noqa: F811
    from inflight.runs import actions, evaluations
    from inflight.runs.models import Run, RunStatus
    from workers.tasks import PlatformReporter

    run = Run.objects.create(owner=owner, name="pushed-panel", config={**tiny_config, "name": "pushed-panel"}, status=RunStatus.RUNNING,
                             started_at=timezone.now() - timedelta(seconds=100), worker_name="cpu-worker-1")
    panel_requests: list[float] = []
    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/")
    page.on("request", lambda request: panel_requests.append(time.monotonic()) if "/panel.json" in request.url else None)
    page.wait_for_selector("#live-indicator.live-live")
    assert page.locator("#checkpoints-table").count() == 0

    # The page rendered its panel: the socket's first open asks for nothing more. Watch 7 s in which
    # nothing changes: the page used to ask every 5 s; now it does not ask at all, while its wall
    # time (from the page's data) goes on counting.
    page.wait_for_timeout(500)
    before, asked_before = seconds_shown(page.inner_text("#run-walltime")), len(panel_requests)
    page.wait_for_timeout(7000)
    after = seconds_shown(page.inner_text("#run-walltime"))
    assert len(panel_requests) == asked_before, "the page polled panel.json while nothing changed"
    assert 100 <= before and 5 <= after - before <= 9, (before, after)

    # A new checkpoint: the worker's push, and the page shows it (the safety poll is a minute away).
    write_checkpoint(run.pk, 5, settings)
    PlatformReporter(run.pk).checkpoints_changed()
    page.wait_for_selector("#checkpoints-table tr[data-step='5']", timeout=10_000)
    assert len(panel_requests) == asked_before + 1

    # An evaluation at a step the list does not show changes nothing in the panel: no fetch (the
    # runs of a sweep evaluate together, and all their pages asked at once).
    evaluations.ingest_eval(run.pk, {"benchmark": "arith", "step": 3, "k": 4, "mean_at_k": 0.5, "pass_at_k": 0.75, "num_problems": 8,
                                  "num_samples": 32}, [])
    page.wait_for_selector("#eval-note:not(.hidden)", timeout=10_000)
    page.wait_for_timeout(2500)
    assert len(panel_requests) == asked_before + 1

    # Its evaluation score, as the checkpoint list shows it (an eval.score push).
    evaluations.ingest_eval(run.pk, {"benchmark": "arith", "step": 5, "k": 4, "mean_at_k": 0.625, "pass_at_k": 0.75, "num_problems": 8,
                                  "num_samples": 32}, [])
    page.wait_for_selector("#checkpoints-table tr[data-step='5'] >> text=arith 0.625", timeout=10_000)

    # A tag set elsewhere (the API, another tab): the panel shows its chip.
    actions.update_run(Run.objects.get(pk=run.pk), owner, {"tags": ["pushed"]})
    page.wait_for_selector("#run-lineage .chip >> text=pushed", timeout=10_000)
    assert page.inner_text("#run-worker b") == "cpu-worker-1"

    page.reload()
    page.wait_for_selector("#live-indicator.live-live")
    page.wait_for_timeout(1500)
    assert page.locator("#checkpoints-table tr[data-step='5']").count() == 1
    page.screenshot(path=str(SCREENSHOT), full_page=False)
    page.close()
