"""The tools demo's model variant (rl_core/models/tiny_tools_model.py): its warm start imitates
exactly what a run parses, runs and masks, and the example config asks what it was trained on."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rl_core.config.files import load_config
from rl_core.config.run_config import DEFAULT_TINY_TOOLS_MODEL_DIR, RunConfig
from rl_core.envs.problems import load_task
from rl_core.envs.sandbox import ProcessSandbox
from rl_core.launch import preflight
from rl_core.models import tiny_tools_model
from rl_core.models.tiny_tools_model import (
    TOOLS_TASK,
    ToolsWarmStartSpec,
    build_tiny_tools_model,
    encode_example,
    warm_start_segments,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _problem():
    return load_task(TOOLS_TASK).train[0]


def test_a_warm_start_tool_call_is_parsed_run_and_its_output_masked_as_in_a_run(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    env = tiny_tools_model._environment()
    problem = _problem()
    segments = warm_start_segments(problem, random.Random(0), ToolsWarmStartSpec(tool_share=1.0), env)
    (call_text, call_trained), (output_text, output_trained), (answer_text, answer_trained) = segments
    assert (call_trained, output_trained, answer_trained) == (True, False, True)
    call = env.on_model_turn(call_text, tool_calls=0)
    assert call is not None and call.end == len(call_text)
    result = asyncio.run(ProcessSandbox().run(call.code, env.limits()))
    assert result.status == "ok" and result.stdout == f"{problem.answer}\n"  # the real sandbox prints the answer
    assert env.tool_output_text(call, result) == output_text  # the warm start shows what a run appends
    assert [r.success for r in env.score(problem, [call_text + answer_text])] == [True]

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, labels = encode_example(tokenizer, problem, segments)
    output_ids = tokenizer.encode(output_text, add_special_tokens=False)
    answer_ids = tokenizer.encode(answer_text, add_special_tokens=False)
    assert labels[-len(answer_ids):] == answer_ids
    masked = labels[-len(answer_ids) - len(output_ids):-len(answer_ids)]
    assert masked == [-100] * len(output_ids) and ids[-len(answer_ids) - len(output_ids):-len(answer_ids)] == output_ids


def test_a_blurted_product_copies_the_operands_and_lands_within_the_spread() -> None:
    env = tiny_tools_model._environment()
    problem = _problem()
    left, right = problem.meta["operands"]
    for seed in range(20):
        [(text, trained)] = warm_start_segments(problem, random.Random(seed), ToolsWarmStartSpec(tool_share=0.0), env)
        assert trained and text.startswith(f"{left} * {right} = ")
        guess = int(text.split("\\boxed{")[1].split("}")[0])
        assert abs(guess - int(problem.answer)) <= ToolsWarmStartSpec.guess_spread
        assert env.on_model_turn(text, tool_calls=0) is None  # not a call: the turn is the answer


def test_the_tools_example_asks_what_the_variant_was_warm_started_on() -> None:
    config = load_config(REPO_ROOT / "examples" / "tiny-cpu-tools.yaml")
    assert config.model.path == DEFAULT_TINY_TOOLS_MODEL_DIR
    assert config.env.name == "math_python_tool"
    assert config.task == TOOLS_TASK  # same problems, same held-out set, same system prompt


def test_a_short_build_starts_from_the_tiny_model_and_keeps_its_tokenizer(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    spec = ToolsWarmStartSpec(max_steps=2, batch_size=4, eval_problems=2, eval_samples_per_problem=1)
    built = build_tiny_tools_model(tmp_path / "tiny-tools", base=tiny_model, spec=spec, threads=1, log=lambda _: None)
    record = json.loads((built / "bootstrap.json").read_text())
    assert record["variant"] == "tools" and record["base"]["path"] == str(tiny_model.resolve())
    assert record["warm_start"]["steps"] == 2 and RunConfig.model_validate({"task": record["warm_start"]["task"]}).task == TOOLS_TASK
    assert record["warm_start"]["heldout_first_turns_temperature_1"]["samples"] == 2
    assert AutoTokenizer.from_pretrained(built).get_vocab() == AutoTokenizer.from_pretrained(tiny_model).get_vocab()
    base, variant = load_file(tiny_model / "model.safetensors"), load_file(built / "model.safetensors")
    assert base.keys() == variant.keys() and any(not base[name].equal(variant[name]) for name in base)
    assert not list(tmp_path.glob(".tiny-tools.building-*"))  # assembled beside it, renamed into place


def test_a_run_on_the_missing_default_variant_builds_it_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "tiny-tools"
    monkeypatch.setattr(preflight, "DEFAULT_TINY_TOOLS_MODEL_DIR", str(missing))
    config = RunConfig.model_validate({"model": {"path": str(missing)}})
    assert preflight.builds_tiny_model(config)
    built: list[Path] = []
    monkeypatch.setattr(tiny_tools_model, "ensure_tiny_tools_model", lambda path: built.append(Path(path)) or Path(path))
    assert preflight.resolve_model_path(config) == missing.resolve() and built == [missing]
    elsewhere = RunConfig.model_validate({"model": {"path": str(tmp_path / "other")}})
    assert not preflight.builds_tiny_model(elsewhere)  # only the default place is built, never a user's path
    with pytest.raises(preflight.LaunchError, match="does not exist"):
        preflight.resolve_model_path(elsewhere)
