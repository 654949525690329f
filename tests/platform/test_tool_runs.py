"""Issue 34 on the platform, without a browser: a multi-turn (tool-using) sample as the actor's
stream carries it (`completion_mask`, `metadata["turns"]`, `tool_calls`, `env`) stored and read
back turn by turn, evaluations that say whether a problem used the tool, the run's env on the
leaderboard and compare, and the Tools charts' grouping."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from inflight.rollouts.models import StoredRollout
from inflight.rollouts.services import attach_train_logprobs, ingest_rollouts
from inflight.rollouts.tokens import decoder_for_model
from inflight.runs import evaluations
from inflight.runs.models import EvalProblemResult, Run
from inflight.runs.run_env import run_env_name
from rl_core.common import metric_names as m

pytestmark = pytest.mark.django_db

DECODER = decoder_for_model("var/models/tiny")
TOOL_METRICS = (
    m.TOOL_CALLS_PER_SAMPLE, m.TOOL_CALL_SHARE, m.TOOL_ERROR_SHARE, m.TOOL_TIMEOUT_SHARE, m.TOOL_SECONDS_MEAN,
    m.TOOL_WAIT_SHARE, m.ENV_TURNS_PER_SAMPLE, m.SUCCESS_WITH_TOOL, m.SUCCESS_WITHOUT_TOOL, m.ENV_PREFIX_REUSE_TOKENS,
)


def tool_run(owner, name: str = "tool-run", env: str | None = "math_python_tool") -> Run:
    config: dict[str, Any] = {
        "trainer": {"samples_per_step": 2}, "model": {"path": "var/models/tiny"}, "actor": {"max_lag": 4},
        "monitoring": {"rollouts": {"keep_every_n_steps": 1}},
    }
    if env is not None:
        config["env"] = {"name": env}
    return Run.objects.create(owner=owner, name=name, config=config)


def multi_turn_sample(line: int = 0, *, tool_status: str = "ok") -> dict[str, Any]:
    """Model turn (v3, v3) · tool output (3 tokens) · model turn (v4 v4 v5): the weights were
    updated while the tool ran (v3 → v4, between turns) and again inside the second model turn."""
    return {
        "sample_id": f"s{line}", "group_id": "g0", "prompt_id": "p0", "prompt_token_ids": [40, 41, 42],
        "completion_token_ids": [50, 51, 60, 61, 62, 52, 53, 54],
        "completion_mask": [1, 1, 0, 0, 0, 1, 1, 1],
        "behaviour_logprobs": [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5, -0.5, -0.5],
        "token_versions": [3, 3, -1, -1, -1, 4, 4, 5],
        "reward": 1.0, "success": True, "advantage": 0.5, "finish_reason": "stop",
        "metadata": {
            "extracted": "7", "tool_calls": 1, "env": "math_python_tool",
            "turns": [
                {"kind": "model", "start": 0, "end": 2},
                {"kind": "tool", "start": 2, "end": 5, "status": tool_status, "seconds": 0.25},
                {"kind": "model", "start": 5, "end": 8},
            ],
        },
    }


def test_a_multi_turn_sample_is_stored_with_its_mask_turns_and_tool_calls(owner) -> None:
    run = tool_run(owner)
    assert ingest_rollouts(run.pk, [(0, multi_turn_sample())], DECODER) == 1
    row = StoredRollout.objects.get(run=run)
    assert row.completion_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert [turn["kind"] for turn in row.turns] == ["model", "tool", "model"]
    assert row.turns[1] == {"kind": "tool", "start": 2, "end": 5, "status": "ok", "seconds": 0.25}
    assert row.tool_calls == 1 and row.env == "math_python_tool"
    # The tool's tokens (version -1) are no policy's: versions and lag count the policy's tokens only.
    assert (row.min_version, row.max_version, row.versions_spanned) == (3, 5, 3)


def test_an_all_ones_mask_and_a_single_turn_sample_store_no_mask(owner) -> None:
    run = tool_run(owner, env=None)
    plain = multi_turn_sample()
    plain["completion_mask"] = [1] * 8
    plain["token_versions"] = [3] * 8
    plain["metadata"] = {"extracted": "7"}
    assert ingest_rollouts(run.pk, [(0, plain)], DECODER) == 1
    row = StoredRollout.objects.get(run=run)
    assert row.completion_mask is None and row.turns is None and row.tool_calls == 0 and row.env == ""


def test_a_mask_of_the_wrong_length_skips_the_line_and_bad_turns_are_dropped(owner) -> None:
    run = tool_run(owner)
    short = multi_turn_sample(0)
    short["completion_mask"] = [1, 0]
    odd_turns = multi_turn_sample(1)
    odd_turns["metadata"]["turns"] = [{"kind": "shell", "start": 0, "end": 8}]
    assert ingest_rollouts(run.pk, [(0, short), (1, odd_turns)], DECODER) == 1
    row = StoredRollout.objects.get(run=run)
    assert row.line == 1 and row.turns is None and row.completion_mask is not None  # shown token by token


def test_the_sample_detail_gives_tool_tokens_no_ratio_and_says_where_the_weights_changed(owner, owner_api) -> None:
    run = tool_run(owner)
    ingest_rollouts(run.pk, [(0, multi_turn_sample())], DECODER)
    row = StoredRollout.objects.get(run=run)
    url = f"/api/runs/{run.pk}/rollouts/{row.pk}/"
    detail = owner_api.get(url).json()
    assert detail["completion_mask"] == [1, 1, 0, 0, 0, 1, 1, 1] and detail["tool_calls"] == 1 and detail["env"] == "math_python_tool"
    # Switches among the policy's tokens: v3 → v4 at the second model turn's first token (the
    # update landed while the tool ran), v4 → v5 inside it; never at the tool's version -1.
    assert detail["version_switches"] == [5, 7]
    model_1, tool, model_2 = detail["turns"]
    assert model_1["versions"] == [3] and model_1["updated_before"] is None
    assert tool["status"] == "ok" and tool["seconds"] == 0.25 and tool.get("versions") is None
    assert model_2["versions"] == [4, 5] and model_2["updated_before"] == {"from": 3, "to": 4}
    # The trainer's logprobs (every token, as it writes them): ratios for the policy's tokens only.
    train = [-0.25, -0.5, 0.0, 0.0, 0.0, -0.5, -0.75, -0.5]
    assert attach_train_logprobs(run.pk, [{"sample_id": "s0", "logprobs": train}]) == 1
    ratios = owner_api.get(url).json()["ratios"]
    assert ratios[2:5] == [None, None, None]
    assert ratios[:2] + ratios[5:] == pytest.approx([math.exp(0.25), 1.0, 1.0, math.exp(-0.25), 1.0])
    summary = owner_api.get(f"/api/runs/{run.pk}/rollouts/").json()["rollouts"][0]
    assert summary["tool_calls"] == 1 and summary["env"] == "math_python_tool"


def test_an_evaluation_says_which_problems_used_the_tool(owner, owner_api, client) -> None:
    run = tool_run(owner)
    line = {"benchmark": "heldout", "step": 4, "k": 2, "mean_at_k": 0.5, "pass_at_k": 0.5, "num_problems": 4, "num_samples": 8}
    rows = [
        {"problem_id": "a", "answer": "1", "samples": ["x", "y"], "verdicts": [True, True], "mean": 1.0, "pass": True, "used_tool": True,
         "samples_used_tool": [True, False]},
        {"problem_id": "b", "answer": "2", "samples": ["x", "y"], "verdicts": [True, False], "mean": 0.5, "pass": True, "used_tool": False,
         "samples_used_tool": [False, False]},
        {"problem_id": "c", "answer": "3", "samples": ["x", "y"], "verdicts": [False, False], "mean": 0.0, "pass": False},
        # Solved by the sample that did not call the tool; the one that called it failed.
        {"problem_id": "d", "answer": "4", "samples": ["x", "y"], "verdicts": [True, False], "mean": 0.5, "pass": True, "used_tool": True,
         "samples_used_tool": [False, True]},
    ]
    score = evaluations.ingest_eval(run.pk, line, rows)
    stored = dict(EvalProblemResult.objects.filter(eval=score).values_list("problem_id", "used_tool"))
    assert stored == {"a": True, "b": False, "c": None, "d": True}  # absent: not recorded, never "no"
    detail = owner_api.get(f"/api/evals/{score.pk}/").json()
    assert {p["problem_id"]: p["used_tool"] for p in detail["problems"]} == stored
    assert {p["problem_id"]: p["samples_used_tool"] for p in detail["problems"]}["d"] == [False, True]
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    cells = {problem: (flag, cell) for problem, flag, cell in re.findall(r'data-problem-id="(\w)".*?data-used-tool="(\w+)">(.*?)</td>', page, re.S)}
    shown = {problem: re.sub(r"<[^>]+>", "", cell) for problem, (flag, cell) in cells.items()}
    assert {problem: flag for problem, (flag, _) in cells.items()} == {"a": "yes", "b": "no", "c": "unknown", "d": "yes"}
    assert shown == {"a": "solved with the tool", "b": "solved without the tool", "c": "—", "d": "solved without the tool"}, shown
    problem = client.get(f"/runs/{run.pk}/evals/{score.pk}/problem.json", {"problem_id": "a"}).json()
    assert problem["used_tool"] is True and [s["used_tool"] for s in problem["samples"]] == [True, False]


def test_an_evaluation_without_tool_records_has_no_tool_column(owner, client) -> None:
    run = tool_run(owner, env=None)
    line = {"benchmark": "heldout", "step": 4, "k": 1, "mean_at_k": 1.0, "pass_at_k": 1.0, "num_problems": 1, "num_samples": 1}
    evaluations.ingest_eval(run.pk, line, [{"problem_id": "a", "answer": "1", "samples": ["x"], "verdicts": [True], "mean": 1.0, "pass": True}])
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-problem-id="a"' in page and "data-used-tool" not in page


def test_a_runs_env_is_its_config_s_or_the_run_configs_default() -> None:
    assert run_env_name({"env": {"name": "math_python_tool"}}) == "math_python_tool"
    assert run_env_name({"env": {"name": "custom", "class_path": "pkg.mod:Env"}}) == "custom"
    # A config from before the env section (or silent on it) ran what RunConfig runs by default.
    from rl_core.config.run_config import RunConfig

    assert run_env_name({}) == run_env_name(None) == run_env_name({"env": None}) == RunConfig().env.name == "math"


def test_leaderboard_and_compare_tell_tool_runs_from_plain_ones(owner, owner_api, client) -> None:
    tool = tool_run(owner, "with-tool")
    plain = tool_run(owner, "plain", env=None)
    rows = {row["name"]: row["env"] for row in owner_api.get("/api/leaderboard/").json()["rows"]}
    assert rows == {"with-tool": "math_python_tool", "plain": "math"}
    client.force_login(owner)
    board = client.get("/leaderboard/").content.decode()
    assert re.search(rf'data-run-id="{tool.pk}".*?data-env="math_python_tool"', board, re.S)
    assert re.search(rf'data-run-id="{plain.pk}".*?data-env="math"', board, re.S)
    compare = client.get("/compare/", {"runs": f"{tool.pk},{plain.pk}"}).content.decode()
    assert re.search(rf'data-run="{tool.pk}".*?data-env="math_python_tool"', compare, re.S)
    assert re.search(rf'data-run="{plain.pk}".*?data-env="math"', compare, re.S)
    assert '"env": "math_python_tool"' in compare  # compare.js names each curve's env when they differ


def test_every_tool_metric_lands_on_a_tools_chart_with_a_label() -> None:
    from inflight.web.charts import CHART_GROUPS

    def group_of(name: str) -> dict[str, Any] | None:  # run_page.js groupOf: the first match wins
        return next((g for g in CHART_GROUPS if any(re.search(p, name) for p in g["patterns"])), None)

    for name in TOOL_METRICS:
        group = group_of(name)
        assert group is not None and group["section"] == "Tools", name
        assert group["labels"][name] and m.DESCRIPTIONS[name] in group["help"], name
    # No other metric of a run is pulled into the Tools block.
    for name in ("reward/mean", "success/mean", "rollout/tokens_per_s", "rollout/samples_written", "train/loss"):
        assert (group_of(name) or {}).get("section") is None, name
