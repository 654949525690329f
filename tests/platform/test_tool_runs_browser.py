"""Issue 34 in a real browser: a run of a tool-using env (`math_python_tool`) with its recorded
multi-turn rollouts and tool metrics, as the worker leaves them (metrics through
`runs.live_ingest.ingest_metrics`, rollouts through `rollouts.services.ingest_rollouts` with the tiny
model's tokenizer, the trainer's logprobs through `attach_train_logprobs`).

The run page has a Tools block of charts whose legends say what each series is (a plain math run
has none); the rollout viewer shows a trajectory as turns, a tool's output apart (grey, no version,
no importance ratio, its status and seconds), the policy versions of each model turn and where the
weights changed between and inside turns; the leaderboard and compare name each run's env.
Screenshots: /tmp/tool_run_charts.png, /tmp/tool_run_sample.png, /tmp/tool_run_sample_ratio.png,
/tmp/tool_run_leaderboard.png.
"""

from __future__ import annotations
from inflight.live import ingest as live_ingest

from pathlib import Path

import pytest

from test_browser import CHROMIUM, browser, daphne_server, signed_in_page  # noqa: F401 - fixtures used by name
from test_first_hour_browser import curve, make_run
from test_tool_runs import multi_turn_sample

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed (apt-get install chromium)"),
]

TOOLS_CHARTS = ("tool_success", "tool_counts", "tool_shares", "tool_seconds", "tool_prefix")


def tool_metrics(steps: int) -> list[dict]:
    return curve(
        steps, reward__mean=lambda s: 0.2 + 0.03 * s, train__loss=lambda s: 1.0 / s,
        tool__calls_per_sample=lambda s: 0.5 + 0.05 * s, env__turns_per_sample=lambda s: 2.0 + 0.1 * s,
        tool__call_share=lambda s: 0.3 + 0.02 * s, tool__error_share=lambda s: 0.2 - 0.005 * s,
        tool__timeout_share=lambda s: 0.05, tool__wait_share=lambda s: 0.02 + 0.01 * (s % 3),
        tool__busy_share=lambda s: 0.2 + 0.01 * (s % 3),
        tool__seconds_mean=lambda s: 0.2 + 0.01 * (s % 4), env__prefix_reuse_tokens=lambda s: 40.0 + 3 * s,
        rollout__success_with_tool=lambda s: 0.3 + 0.03 * s, rollout__success_without_tool=lambda s: 0.2 + 0.01 * s,
    )


def stored_tool_run(owner):
    from inflight.rollouts.services import attach_train_logprobs, ingest_rollouts
    from inflight.rollouts.tokens import decoder_for_model

    run = make_run(owner, "python-tool", records=tool_metrics(12), **{"env.name": "math_python_tool", "monitoring.rollouts.keep_every_n_steps": 1})
    ingest_rollouts(run.pk, [(0, multi_turn_sample(0)), (1, multi_turn_sample(1, tool_status="timeout"))], decoder_for_model("var/models/tiny"))
    attach_train_logprobs(run.pk, [{"sample_id": "s0", "logprobs": [-0.25, -0.5, 0.0, 0.0, 0.0, -0.5, -0.75, -0.5]}])
    from inflight.runs import evaluations

    evaluations.ingest_eval(run.pk, {"benchmark": "heldout", "step": 12, "k": 2, "mean_at_k": 0.5, "pass_at_k": 0.67, "num_problems": 3, "num_samples": 6}, [
        {"problem_id": "h1", "problem": "Compute 12 * 13.", "answer": "156", "samples": ["a", "b"], "extracted": ["156", "156"], "verdicts": [True, True], "mean": 1.0, "pass": True, "used_tool": True, "samples_used_tool": [True, False]},
        {"problem_id": "h2", "problem": "Compute 2 + 3.", "answer": "5", "samples": ["a", "b"], "extracted": ["5", "6"], "verdicts": [True, False], "mean": 0.5, "pass": True, "used_tool": False},
        {"problem_id": "h3", "problem": "Compute 17 * 19 - 4.", "answer": "319", "samples": ["a", "b"], "extracted": ["320", None], "verdicts": [False, False], "mean": 0.0, "pass": False, "used_tool": True},
    ])
    return run


def test_a_tool_run_shows_its_tools_charts_and_its_trajectories_as_turns(daphne_server: str, owner, browser) -> None:  # noqa: F811
    from inflight.rollouts.models import StoredRollout

    run = stored_tool_run(owner)
    plain = make_run(owner, "plain-math", records=curve(12, reward__mean=lambda s: 0.1 * s, train__loss=lambda s: 1.0 / s))
    page = signed_in_page(browser, daphne_server, f"/runs/{run.pk}/", height=1500)

    # The Tools block: every chart, under one heading, each series named by what it is.
    page.wait_for_selector("#charts-section-tools #chart-tool_prefix .main-svg")
    assert page.locator("#charts-section-tools > h2").inner_text() == "Tools"
    for chart in TOOLS_CHARTS:
        assert page.locator(f"#charts-section-tools #chart-{chart} .main-svg").count() >= 1, chart
    legend = page.locator("#chart-tool_success .legend").text_content()
    assert "samples that called the tool" in legend and "samples that answered without it" in legend, legend
    shares_legend = page.locator("#chart-tool_shares .legend").text_content()
    assert "calls timed out" in shares_legend and "rollout time with a call running" in shares_legend, shares_legend
    # The title's hover help says what each series is, in metric_names' words.
    assert "stopped at the wall-clock limit" in page.locator("#chart-tool_shares h3").get_attribute("title")
    assert page.locator("#run-env").inner_text() == "env math_python_tool"
    page.locator("#charts-section-tools").scroll_into_view_if_needed()
    page.screenshot(path="/tmp/tool_run_charts.png", full_page=False)

    # The held-out table says which problems were solved with the tool.
    page.locator(".eval-card details summary").first.click()
    cells = dict(page.eval_on_selector_all("tr.eval-problem", "els => els.map(e => [e.dataset.problemId, e.querySelector('.eval-tool').innerText])"))
    assert cells == {"h1": "solved with the tool", "h2": "solved without the tool", "h3": "used the tool"}, cells
    page.locator(".eval-card").first.scroll_into_view_if_needed()
    page.screenshot(path="/tmp/tool_run_evaluations.png", full_page=False)
    # Its samples say which called the tool.
    page.locator('tr.eval-problem[data-problem-id="h1"]').click()
    page.wait_for_selector("#sample-view:not(.hidden) .eval-sample")
    assert page.eval_on_selector_all("#sample-tokens .eval-sample", "els => els.map(e => !!e.querySelector('[data-used-tool]'))") == [True, False]
    assert "used the tool" in page.locator("#sample-meta").inner_text()
    page.screenshot(path="/tmp/tool_run_eval_samples.png", full_page=False)
    page.click("#sample-close")

    # The rollout viewer: one trajectory, turn by turn.
    page.click("#rollouts-tab")
    first = StoredRollout.objects.get(run=run, sample_id="s0")
    row = page.locator(f'#rollouts-body tr[data-id="{first.pk}"]')
    assert "1 tool call" in row.locator(".tool-badge").inner_text()
    row.click()
    page.wait_for_selector("#sample-view:not(.hidden) .turn")
    kinds = page.eval_on_selector_all("#sample-tokens .turn", "els => els.map(e => e.dataset.kind)")
    assert kinds == ["model", "tool", "model"], kinds
    tool = page.locator('#sample-tokens .turn[data-kind="tool"]')
    assert tool.locator(".tok").count() == 3 and tool.locator(".tok.tok-tool").count() == 3
    assert tool.locator(".tool-status").inner_text() == "ok" and "0.25 s" in tool.inner_text()
    # Tool tokens carry no version and no ratio; the policy's tokens carry both.
    assert page.locator("#sample-tokens .tok-tool[data-version], #sample-tokens .tok-tool[data-ratio]").count() == 0
    assert page.locator("#sample-tokens .tok[data-ratio]").count() == 5
    # Versions across turns: v3 before the tool, an update while it ran (v3 → v4), another inside the last turn.
    second = page.locator('#sample-tokens .turn[data-turn="2"]')
    assert "weights updated before this turn: v3 → v4" in second.inner_text()
    assert "v4 → v5" in second.locator(".turn-versions").inner_text()
    assert page.locator("#sample-tokens .tok.tok-switch").count() == 2
    assert page.locator('#sample-legend .legend-item[data-tool="1"]').count() == 1
    assert sorted(page.eval_on_selector_all("#sample-legend .legend-item[data-version]", "els => els.map(e => e.dataset.version)")) == ["3", "4", "5"]
    page.screenshot(path="/tmp/tool_run_sample.png", full_page=False)
    # Coloured by importance ratio: the policy's tokens take a colour, the tool's keep their grey.
    page.check("#colour-ratio")
    tool_colours = set(tool.locator(".tok").evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)"))
    assert tool_colours == {"rgb(229, 231, 235)"}, tool_colours  # .tok-tool's #e5e7eb, never a ratio's
    page.screenshot(path="/tmp/tool_run_sample_ratio.png", full_page=False)
    page.click("#sample-close")

    # The timed-out call of the other sample says so.
    other = StoredRollout.objects.get(run=run, sample_id="s1")
    page.locator(f'#rollouts-body tr[data-id="{other.pk}"]').click()
    page.wait_for_selector('#sample-view:not(.hidden) .tool-status[data-status="timeout"]')
    page.click("#sample-close")

    # After a reload the page is the same.
    page.reload()
    page.click('[data-run-tab="metrics"]')  # the reload opens the Rollouts tab it was left on
    page.wait_for_selector("#charts-section-tools #chart-tool_prefix .main-svg")
    # Drawn while their tab was hidden, the plots are fitted to their cards once shown (not
    # Plotly's default 700 px, which overflowed each card).
    page.wait_for_function("""() => [...document.querySelectorAll('#charts .chart-card')].every(card => {
        const svg = card.querySelector('.main-svg');
        return svg && svg.getBoundingClientRect().width <= card.clientWidth; })""", timeout=5_000)
    page.screenshot(path="/tmp/tool_run_charts_reloaded.png", full_page=False)
    assert page.locator("#charts-section-tools .chart-card").count() == len(TOOLS_CHARTS)

    # A plain math run has no Tools block at all.
    page.goto(f"{daphne_server}/runs/{plain.pk}/")
    page.wait_for_selector("#chart-reward .main-svg")
    assert page.locator("#charts-section-tools").count() == 0 and page.locator("#run-env").inner_text() == "env math"

    # Leaderboard and compare tell the two apart.
    page.goto(f"{daphne_server}/leaderboard/")
    assert page.locator(f'tr[data-run-id="{run.pk}"] .env-label').inner_text() == "math_python_tool"
    assert page.locator(f'tr[data-run-id="{plain.pk}"] .env-label').inner_text() == "math"
    page.screenshot(path="/tmp/tool_run_leaderboard.png", full_page=False)
    page.goto(f"{daphne_server}/compare/?runs={run.pk},{plain.pk}&metrics=reward/mean")
    page.wait_for_selector("#charts .main-svg")
    names = page.locator("#charts .legend").first.text_content()
    assert "[math_python_tool]" in names and "[math]" in names, names
    page.screenshot(path="/tmp/tool_run_compare.png", full_page=False)


def test_the_create_page_offers_the_env_and_refuses_a_custom_class_outside_the_allowed_folders(daphne_server: str, owner, browser) -> None:  # noqa: F811
    # The tool preset opens with its env; the env section is generated from RunConfig with its help.
    page = signed_in_page(browser, daphne_server, "/runs/new/%3Fpreset=tiny-cpu-tools", height=1200)
    assert page.locator('select[name="env.name"]').input_value() == "math_python_tool"
    choices = page.eval_on_selector_all('select[name="env.name"] option', "els => els.map(e => e.value)")
    assert choices == ["math", "math_python_tool", "custom"], choices
    for name in ("env.max_turns", "env.tool_wall_s", "env.tool_memory_mb", "env.tool_output_bytes", "env.class_path"):
        assert page.locator(f'[name="{name}"]').count() == 1, name
    env_field = page.locator('[name="env.name"]').locator("xpath=ancestor::fieldset[1]")
    assert "sandbox" in env_field.inner_text()  # env.name's help says what each choice does
    env_field.scroll_into_view_if_needed()
    page.screenshot(path="/tmp/tool_create_env.png", full_page=False)
    # The YAML tab follows the form (config_sync.js): the env is in the text a launch would send.
    page.select_option('select[name="env.name"]', "custom")
    page.fill('input[name="env.class_path"]', "os.path:join")  # an installed module, not an allowed folder's
    with page.expect_navigation():
        page.click("#launch-form")
    page.wait_for_load_state("networkidle")
    links = {link.get_attribute("href") for link in page.locator("#error-summary a[data-error-link]").all()}
    assert links == {"#f-env.class_path"}, links
    error = page.locator('[data-error-for="env.class_path"]')
    assert error.is_visible() and "INFLIGHT_ENV_ROOTS" in error.inner_text()
    assert page.locator('select[name="env.name"]').input_value() == "custom"  # the form comes back as sent
    page.locator('[name="env.class_path"]').scroll_into_view_if_needed()
    page.screenshot(path="/tmp/tool_create_refused.png", full_page=False)
