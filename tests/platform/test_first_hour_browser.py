"""What a new user meets in the first hour (issue 26), in a real browser: Debian's chromium driven
by Playwright against a real Daphne server on the test PostgreSQL and Redis.

Runs are made in the database as the worker leaves them (metrics ingested through
`runs.live_ingest.ingest_metrics`, evaluations through `evaluations.ingest_eval`, rollouts through
`rollouts.services.ingest_rollouts` decoded by the tiny model's real tokenizer), so each page is
checked on known figures in seconds; the held-out evaluation test runs the real engine through a
real Celery worker. Screenshots: tests/platform/screenshots.py (docs/screenshots/ when asked, for the README).
"""

from __future__ import annotations
from inflight.live import ingest as live_ingest

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import yaml

from test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - the fixtures are used by name

REPO_ROOT = Path(__file__).resolve().parents[2]
from tests.platform.screenshots import SCREENSHOTS  # noqa: E402  (docs/screenshots/ only when asked)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]


def demo_config(**overrides: Any) -> dict[str, Any]:
    """The demo preset (examples/tiny-cpu.yaml) resolved as a submission is (a run's defaults
    where it is silent), with dotted overrides."""
    from rl_core.config.run_config import RunConfig
    from rl_core.config.files import with_run_defaults

    data = yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text())
    for dotted, value in overrides.items():
        node = data
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return RunConfig.model_validate(with_run_defaults(data)).model_dump(mode="json")


def make_run(owner, name: str, status: str = "succeeded", records: list[dict[str, Any]] | None = None, **config: Any):
    """A run as the worker leaves it: its status and timing, and its metrics.jsonl records ingested."""
    from django.utils import timezone

    from inflight.runs import services
    from inflight.runs.models import Run

    now = timezone.now()
    terminal = status in ("succeeded", "failed", "cancelled", "lost")
    run = Run.objects.create(
        owner=owner, name=name, config=demo_config(name=name, **config), status=status,
        started_at=now - timedelta(seconds=300), finished_at=now if terminal else None,
    )
    points = [p for line, record in enumerate(records or []) for p in live_ingest.points_from_metrics_record(line, record)]
    for start in range(0, len(points), 500):
        live_ingest.ingest_metrics(run.pk, points[start:start + 500])
    return run


def curve(steps: int, **series: Callable[[int], float | None]) -> list[dict[str, Any]]:
    """One metrics.jsonl record per step with each named series' value at that step (None: not logged)."""
    records = []
    for step in range(1, steps + 1):
        record: dict[str, Any] = {"t": 1_700_000_000 + step, "step": step}
        for name, value_of in series.items():
            value = value_of(step)
            if value is not None:
                record[name.replace("__", "/")] = value
        records.append(record)
    return records



def screenshot(page: Any, name: str, full_page: bool = False) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=full_page)
    return path


# ---------------------------------------------------------------- 2. form errors are seen


def test_create_page_errors_show_a_summary_linking_to_each_field(daphne_server: str, owner, browser) -> None:
    page = signed_in_page(browser, daphne_server, "/runs/new/%3Fpreset=tiny-cpu")
    page.fill('input[name="trainer.max_steps"]', "-5")
    page.fill('input[name="trainer.lr"]', "fast")
    # The launch waits for the form's sync with the YAML tab (config_sync.js), then posts.
    with page.expect_navigation():
        page.click("#launch-form")
    page.wait_for_load_state("networkidle")

    # The answer is the form again, and what is wrong is the first thing in view, focused.
    summary = page.locator("#error-summary")
    assert summary.is_visible()
    box = summary.bounding_box()
    assert box is not None and 0 <= box["y"] < 900, box
    assert page.evaluate("document.activeElement && document.activeElement.id") == "error-summary"
    assert "2 problems" in summary.inner_text()
    links = {link.get_attribute("href"): link.inner_text() for link in summary.locator("a[data-error-link]").all()}
    assert links == {"#f-trainer.lr": "trainer.lr", "#f-trainer.max_steps": "trainer.max_steps"}, links
    screenshot(page, "create_page_error.png")

    # A link takes the user to the field, focused and in view, three screens down or not.
    summary.locator('a[href="#f-trainer.max_steps"]').click()
    assert page.evaluate("document.activeElement.id") == "f-trainer.max_steps"
    field_box = page.locator("#f-trainer\\.max_steps").bounding_box()
    assert field_box is not None and 0 <= field_box["y"] < 900
    assert page.locator('[data-error-for="trainer.max_steps"]').is_visible()


# ---------------------------------------------------------------- 5. the leaderboard tells the truth


def test_leaderboard_defaults_to_a_figure_every_run_has_and_says_what_each_measures(daphne_server: str, owner, browser) -> None:
    from inflight.runs import evaluations

    # "lucky" has the best single training batch (0.95) but the worst held-out success; only
    # "aime" was evaluated on AIME 2024, the old default sort.
    lucky = make_run(owner, "lucky-batch", records=curve(
        40, success__mean=lambda s: 0.95 if s == 7 else 0.3, success__heldout=lambda s: 0.40 if s % 10 == 0 else None))
    steady = make_run(owner, "steady", records=curve(
        40, success__mean=lambda s: 0.6, success__heldout=lambda s: 0.70 if s % 10 == 0 else None))
    aime = make_run(owner, "aime", records=curve(
        40, success__mean=lambda s: 0.5, success__heldout=lambda s: 0.55 if s % 10 == 0 else None))
    evaluations.ingest_eval(aime.pk, {"benchmark": "aime24", "step": 40, "k": 4, "mean_at_k": 0.1, "pass_at_k": 0.2,
                                   "num_problems": 30, "num_samples": 120}, [])

    page = signed_in_page(browser, daphne_server, "/leaderboard/")
    table = page.locator("#leaderboard")
    assert table.get_attribute("data-sort") == "-heldout_last"
    order = [int(row.get_attribute("data-run-id")) for row in table.locator("tbody tr").all()]
    assert order == [steady.pk, aime.pk, lucky.pk]
    headers = {th.get_attribute("data-column"): (th.inner_text(), th.get_attribute("title")) for th in table.locator("th[data-column]").all()}
    assert headers["heldout_last"][0].startswith("Held-out success, latest")
    assert headers["success_best"][0].startswith("Train-batch success, best step") and "noisiest" in headers["success_best"][1]
    assert all(title for _, title in headers.values())  # every figure says what it measures
    assert "math500_last" not in headers  # no listed run has MATH-500: no empty column
    assert page.locator(f'tr[data-run-id="{steady.pk}"] td[data-column="heldout_last"]').inner_text() == "70.0%"
    screenshot(page, "leaderboard.png")

    # The API answers the same default, and says which it applied.
    from inflight.accounts.services import create_token

    api = httpx.get(f"{daphne_server}/api/leaderboard/", headers={"Authorization": f"Token {create_token(owner).key}"})
    assert api.json()["sort"] == "-heldout_last" and [r["run_id"] for r in api.json()["rows"]] == order


# ---------------------------------------------------------------- the run list as a triage table


def test_run_list_is_a_triage_table_with_progress_latest_figures_sparklines_and_picked_columns(daphne_server: str, owner, browser) -> None:
    running = make_run(owner, "climbing", status="running", **{"trainer.max_steps": 200}, records=curve(
        60, reward__mean=lambda s: s / 60, success__heldout=lambda s: 0.2 + s / 200 if s % 5 == 0 else None,
        train__loss=lambda s: 1 / s))
    done = make_run(owner, "finished", **{"trainer.max_steps": 200}, records=curve(
        200, reward__mean=lambda s: 0.5, success__heldout=lambda s: 0.6 if s % 50 == 0 else None))

    page = signed_in_page(browser, daphne_server, "/")
    row = page.locator(f'tr[data-run-id="{running.pk}"]')
    assert row.locator("[data-progress-of]").inner_text().strip() == "step 60 / 200"
    assert row.locator('[data-latest="heldout"]').inner_text() == "50.0%"
    assert row.locator('[data-latest="reward"]').inner_text() == "1"
    assert row.locator('td[data-col="trend"] svg.spark polyline').count() == 1
    assert page.locator(f'tr[data-run-id="{done.pk}"] [data-progress-of]').inner_text().strip() == "step 200 / 200"
    assert page.locator('th[data-col="loss"]').is_hidden()  # offered, not shown by default
    screenshot(page, "run_list.png")

    # Columns the user picks: shown and hidden at once, and still so after a reload.
    page.click("#column-picker summary")
    page.check('[data-pick-col="loss"]')
    page.uncheck('[data-pick-col="trend"]')
    assert row.locator('td[data-col="loss"]').is_visible() and row.locator('td[data-col="trend"]').is_hidden()
    page.reload()
    row = page.locator(f'tr[data-run-id="{running.pk}"]')
    assert row.locator('td[data-col="loss"]').inner_text() == "0.0167"
    assert row.locator('td[data-col="loss"]').is_visible() and row.locator('td[data-col="trend"]').is_hidden()


# ---------------------------------------------------------------- 6. the rollout viewer


SYSTEM_PROMPT = "You are a careful calculator. Think step by step and put the final answer in \\boxed{}."


def seed_rollouts(run, tiny_model: Path, count: int = 6, first_line: int = 0) -> None:
    from tokenizers import Tokenizer

    from inflight.rollouts import services as rollout_services
    from inflight.rollouts.tokens import decoder_for_model

    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    records = []
    for index in range(first_line, first_line + count):
        prompt = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nWhat is {index} + 12?<|im_end|>\n<|im_start|>assistant\n"
        completion = tokenizer.encode(f"{index} plus 12 makes {index + 12}, so the answer is \\boxed{{{index + 12}}}", add_special_tokens=False).ids
        half = len(completion) // 2
        records.append((index, {
            "sample_id": f"s{index}", "group_id": f"g{index // 2}", "prompt_id": f"p{index}",
            "prompt_token_ids": tokenizer.encode(prompt, add_special_tokens=False).ids, "completion_token_ids": completion,
            "behaviour_logprobs": [-0.5] * len(completion), "token_versions": [3] * half + [4] * (len(completion) - half),
            "reward": 1.0, "success": True, "advantage": 0.5, "finish_reason": "stop", "metadata": {"extracted": str(index + 12)},
        }))
    rollout_services.ingest_rollouts(run.pk, records, decoder_for_model(str(tiny_model)))


def test_rollout_viewer_shows_the_problem_an_inline_switch_mark_and_starts_near_the_top(daphne_server: str, owner, browser, tiny_model: Path, settings) -> None:
    run = make_run(owner, "viewer", **{"trainer.samples_per_step": 2, "monitoring.rollouts.keep_every_n_steps": 1})
    # A run with many checkpoints: their table used to push the rollouts ~900 px down.
    for step in range(5, 125, 5):
        folder = Path(settings.INFLIGHT_RUNS_DIR) / str(run.pk) / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(json.dumps({"t": time.time(), "step": step}))
    seed_rollouts(run, tiny_model)

    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/")
    page.click("#rollouts-tab")
    rows = page.locator("#rollouts-body tr.rollout-row")
    rows.first.wait_for()
    # The table starts in the first screen, under the tab bar (which stays in view).
    first_row = rows.first.bounding_box()
    tabs = page.locator(".run-tabs").bounding_box()
    assert first_row is not None and tabs is not None and first_row["y"] < 500 and 0 <= tabs["y"] < first_row["y"], (first_row, tabs)
    # And the checkpoint list above it stays a short box, however many checkpoints there are.
    checkpoints = page.locator("#checkpoints").bounding_box()
    assert checkpoints is not None and checkpoints["height"] < 360, checkpoints
    prompts = {rows.nth(i).locator("td").nth(1).inner_text() for i in range(rows.count())}
    assert "What is 0 + 12?" in prompts and not any(SYSTEM_PROMPT[:20] in text for text in prompts), prompts

    rows.first.click()
    page.wait_for_selector("#sample-view:not(.hidden) #sample-tokens .tok")
    mark = page.locator("#sample-tokens .tok.tok-switch")
    assert mark.count() == 1
    # The weight-switch token is a token in the line, not a full-width block splitting it.
    assert mark.evaluate("el => getComputedStyle(el).display") == "inline"
    token_box, text_box = mark.bounding_box(), page.locator("#sample-tokens").bounding_box()
    assert token_box is not None and text_box is not None and token_box["width"] < text_box["width"] / 4
    assert "What is" in page.locator("#sample-prompt").inner_text()
    screenshot(page, "rollout_sample.png")


# ---------------------------------------------------------------- 9. stop, wall time, charts, compare


def test_rollout_rows_come_over_the_socket_only_while_the_rollouts_tab_shows(daphne_server: str, owner, browser, tiny_model: Path, wait, monkeypatch) -> None:
    """A run page on its charts gets no rollout rows (at 200 live runs they were most of what pages
    were sent); showing the Rollouts tab loads the stored rows and then takes new ones live; rows
    stored while the tab was hidden are there when it shows again. After a reload too."""
    run = make_run(owner, "watched", status="running", **{"trainer.samples_per_step": 2, "monitoring.rollouts.keep_every_n_steps": 1})
    seed_rollouts(run, tiny_model, count=2)
    page = signed_in_page(browser, daphne_server, "/runs/")
    frames: list[str] = []
    page.on("websocket", lambda socket: socket.on("framereceived", lambda payload: frames.append(str(payload))))
    rows = page.locator("#rollouts-body tr.rollout-row")

    def rollout_frames() -> int:
        return sum(1 for frame in frames if '"rollouts.batch"' in frame)

    def received(text: str) -> bool:
        page.wait_for_timeout(100)  # Playwright delivers the socket's frames while it runs
        return any(text in frame for frame in frames)

    def open_run_page() -> None:
        page.goto(f"{daphne_server}/runs/{run.pk}/")
        wait(lambda: received('"hello"'), timeout=30, interval=0.2, message="the run page's socket open")

    open_run_page()
    seed_rollouts(run, tiny_model, count=2, first_line=2)
    page.wait_for_timeout(2000)
    assert rollout_frames() == 0 and rows.count() == 0  # the charts show: no rows sent, none loaded

    page.click("#rollouts-tab")
    wait(lambda: rows.count() == 4, timeout=30, interval=0.2, message="the stored rows loaded when the tab shows")
    seed_rollouts(run, tiny_model, count=2, first_line=4)
    wait(lambda: rows.count() == 6, timeout=30, interval=0.2, message="new rows arriving live")
    assert rollout_frames() == 1
    # The counts follow (rollouts.js asks for them alone, a few seconds after the rows came).
    wait(lambda: "trained 6" in page.inner_text("#rollouts-counts"), timeout=30, interval=0.5, message="the counts after the live rows")
    screenshot(page, "rollouts_watched.png")

    page.click('[data-run-tab="metrics"]')
    seed_rollouts(run, tiny_model, count=2, first_line=6)
    page.wait_for_timeout(2000)
    assert rollout_frames() == 1  # hidden again: nothing sent
    page.click("#rollouts-tab")
    wait(lambda: rows.count() == 8, timeout=30, interval=0.2, message="rows stored while the tab was hidden")

    # Reloaded on the Rollouts tab (#rollouts in the address): it asks again on the new socket.
    frames.clear()
    page.reload()
    wait(lambda: rows.count() == 8, timeout=30, interval=0.2, message="the rows after a reload")
    wait(lambda: received('"watching"'), timeout=30, interval=0.2, message="the new socket watching the rows")
    seed_rollouts(run, tiny_model, count=2, first_line=8)
    wait(lambda: rows.count() == 10, timeout=30, interval=0.2, message="live rows after the reload")

    # A burst larger than one push (a worker catching up): the push says what it left out and the
    # tab loads its list again, so no stored row is missing from it.
    from inflight.rollouts import services as rollout_services

    monkeypatch.setattr(rollout_services, "PUSH_ROWS", 1)
    seed_rollouts(run, tiny_model, count=4, first_line=10)
    wait(lambda: rows.count() == 14, timeout=30, interval=0.2, message="every row of a burst larger than one push")
    page.close()


def test_stop_asks_first(daphne_server: str, owner, browser) -> None:
    from inflight.runs.models import Run

    run = make_run(owner, "to-stop", status="running")
    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/")
    questions: list[str] = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    page.click("#stop-button")
    page.wait_for_timeout(500)
    assert questions and f"Stop run #{run.pk}" in questions[0]
    assert Run.objects.get(pk=run.pk).status == "running"  # dismissed: nothing sent
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#stop-button")
    page.wait_for_load_state("networkidle")
    assert Run.objects.get(pk=run.pk).status == "cancelling"


def test_wall_time_leaves_out_the_time_a_run_sat_cancelled(daphne_server: str, owner, browser, settings) -> None:
    """It ran 120 s, sat cancelled for an hour, was resumed: its wall time is 120 s and counts on
    from there once a worker starts it, on the resume action's own path."""
    from django.utils import timezone

    from inflight.runs import actions, services
    from inflight.runs.models import Run

    run = make_run(owner, "resumable", status="cancelled")
    hour_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=run.pk).update(started_at=hour_ago - timedelta(seconds=120), finished_at=hour_ago)
    folder = Path(settings.INFLIGHT_RUNS_DIR) / str(run.pk) / "checkpoints" / "step_000010"
    folder.mkdir(parents=True)
    (folder.parent / "latest").symlink_to("step_000010")
    original = actions.resume_problem
    actions.resume_problem = lambda locked: None  # a readable checkpoint is resume_problem's own tests' matter
    try:
        resumed = actions.resume_run(Run.objects.get(pk=run.pk), owner)
    finally:
        actions.resume_problem = original
    assert resumed.status == "queued" and resumed.started_at is None
    assert resumed.earlier_attempts_s == pytest.approx(120, abs=1) and resumed.wall_time_s == pytest.approx(120, abs=1)
    services.transition_run(run.pk, "starting")
    assert Run.objects.get(pk=run.pk).wall_time_s == pytest.approx(120, abs=5)

    page = signed_in_page(browser, daphne_server, "/")
    assert page.locator(f'[data-walltime-of="{run.pk}"]').inner_text() in {f"2m {s:02d}s" for s in range(0, 10)}


def test_charts_fit_their_scale_flat_panels_step_aside_and_lag_shares_have_their_own_colours(daphne_server: str, owner, browser) -> None:
    lag_shares = {f"policy_lag__share__{k}": (lambda k: lambda s: 0.1 + 0.01 * k + 0.001 * s)(k) for k in range(8)}
    lag_shares["policy_lag__share__8+"] = lambda s: 0.05 + 0.001 * s
    names = {f"extra__m{i:02d}": (lambda i: lambda s: i + s)(i) for i in range(30)}
    run = make_run(owner, "charts", records=curve(
        30, custom__tiny=lambda s: 0.001 * s, custom__huge=lambda s: 1000.0 * s, train__dropped_stale=lambda s: 0.0,
        reward__mean=lambda s: s / 30, **lag_shares, **names))

    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1400)
    page.wait_for_selector("#chart-more-custom .main-svg")
    assert "chart-log" in page.locator("#chart-more-custom").get_attribute("class")  # 0.001 .. 30000 on one axis
    assert "chart-log" not in page.locator("#chart-reward").get_attribute("class")
    assert "chart-flat" in page.locator("#chart-stale").get_attribute("class")  # always 0: small, at the end
    colours = page.evaluate("""() => document.querySelector('#chart-lag_share .plot').data
        .filter(t => t.showlegend !== false || t.name.indexOf(' min') < 0 && t.name.indexOf(' max') < 0)
        .filter(t => t.hovertemplate && t.hovertemplate.indexOf('(smoothed)') >= 0).map(t => t.line.color)""")
    assert len(colours) == 9 and len(set(colours)) == 9, colours
    page.screenshot(path="/tmp/inflight_charts_fitted.png", full_page=True)  # to look at; the README shows the run page elsewhere

    # The compare page's long metric list has a search.
    page.goto(f"{daphne_server}/compare/?runs={run.pk}")
    page.locator("#metric-select option").nth(40).wait_for(state="attached")
    page.fill("#metric-search", "share")
    shown = page.evaluate("Array.from(document.querySelectorAll('#metric-select option')).filter(o => !o.hidden && !o.selected).map(o => o.value)")
    assert shown and all("share" in name for name in shown), shown
    page.press("#metric-search", "Enter")
    assert shown[0] in page.evaluate("Array.from(document.querySelector('#metric-select').selectedOptions).map(o => o.value)")
    page.wait_for_selector("#charts .chart-card >> nth=0")


# ---------------------------------------------------------------- 3. the held-out evaluation is an evaluation


@pytest.mark.slow
def test_heldout_evaluation_is_shown_exported_and_served_as_an_evaluation(daphne_server: str, start_worker, owner, browser, tiny_model: Path, wait) -> None:
    from inflight.accounts.services import create_token
    from inflight.runs import services
    from inflight.runs.models import Run

    start_worker("cpu")
    config = {
        **yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text()),
        "name": "heldout-evals", "max_wall_time_s": 240,
    }
    config["trainer"].update(max_steps=4, samples_per_step=8, warmup_steps=1)
    config["actor"].update(group_size=4, groups_in_flight=2)
    config["task"]["heldout_size"] = 8
    config["eval"] = {"heldout_every_n_steps": 2, "heldout_k": 2}
    run = services.create_run(owner, "heldout-evals", config)
    done = wait(lambda: (r := Run.objects.get(pk=run.pk)).is_terminal and r, timeout=400, interval=1, message="the run to end")
    assert done.status == "succeeded", done.error

    token = create_token(owner).key
    api = httpx.Client(base_url=daphne_server, headers={"Authorization": f"Token {token}"}, timeout=30)
    evals = api.get(f"/api/runs/{run.pk}/evals/").json()["evals"]
    heldout = [e for e in evals if e["benchmark"] == "heldout"]
    # Every 2 steps as the actor sees the policy version: under load it may first see version 3
    # rather than 2, and evaluates there; the start and the final step are always evaluated.
    steps = [e["step"] for e in heldout]
    assert steps[0] == 0 and steps[-1] == 4 and len(steps) >= 3 and steps == sorted(set(steps)), evals
    assert all(e["num_problems"] == 8 and e["k"] == 2 for e in heldout)
    detail = api.get(f"/api/evals/{heldout[-1]['id']}/").json()
    assert len(detail["problems"]) == 8 and all(len(p["samples"]) == 2 for p in detail["problems"])
    export = api.get(f"/api/runs/{run.pk}/export/evals.jsonl").text.splitlines()
    assert len(export) == 8 * len(heldout) and all(json.loads(line)["benchmark"] == "heldout" for line in export)

    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1400)
    card = page.locator(".eval-card", has=page.locator('h3[data-benchmark="heldout"]'))
    card.wait_for()
    assert "held-out set" in card.locator("h3").inner_text()
    assert f"step {heldout[-1]['step']}" in card.inner_text() and "8 problems × 2" in card.inner_text()
    assert "No evaluation yet" not in page.content()
    card.locator("details").evaluate("details => { details.open = true; }")  # open already when a problem flipped
    card.locator("tr.eval-problem").first.click()
    page.wait_for_selector("#sample-view:not(.hidden) .eval-sample")
    assert page.locator("#sample-view .eval-sample").count() == 2
    page.click("#sample-close")
    page.wait_for_selector(".chart-card .main-svg")  # the screenshot shows the charts above it too
    card.scroll_into_view_if_needed()
    screenshot(page, "run_page_evaluations.png")
