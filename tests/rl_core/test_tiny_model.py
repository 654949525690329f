"""The tiny model: offline build, reproducibility, HF loading, chat template, warm-start record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import random

from rl_core.envs.problems import make_arithmetic_problem
from rl_core.models.tiny_model import (
    IM_END,
    WarmStartSpec,
    build_tiny_model,
    describe_behaviour,
    ensure_tiny_model,
    is_built,
    is_quick_guess,
    warm_start_target,
)


def test_builds_a_qwen2_model_that_hf_auto_classes_load(untrained_tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(untrained_tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(untrained_tiny_model)
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size // model.config.num_attention_heads == 64  # vLLM CPU needs head_dim 64
    assert getattr(model.config, "head_dim", 64) == 64
    assert 3_000_000 <= sum(p.numel() for p in model.parameters()) <= 20_000_000
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token is not None
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.vocab_size >= len(tokenizer)
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer.encode("Compute 1 + 2.")])).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


def test_chat_template_round_trips(untrained_tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(untrained_tiny_model)
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "Compute 12 - 7."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nSolve it.<|im_end|>\n<|im_start|>user\nCompute 12 - 7.<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # special tokens stay single tokens
    # Byte-level: any text, LaTeX and non-ASCII included, decodes back exactly; digits are single tokens.
    sample = "Let $x^2 = \\frac{1}{2}$, café 你好 \\boxed{-12345}"
    assert tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False)) == sample
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]


def test_same_seed_same_model_other_seed_other_weights(untrained_tiny_model: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0, warm_start=False, log=lambda _: None)
    other = build_tiny_model(tmp_path / "other", seed=1, warm_start=False, log=lambda _: None)
    first, second, third = (load_file(str(p / "model.safetensors")) for p in (untrained_tiny_model, again, other))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["model.layers.0.self_attn.q_proj.weight"], third["model.layers.0.self_attn.q_proj.weight"])
    assert (untrained_tiny_model / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()


def test_short_warm_start_is_reproducible_and_recorded(tmp_path: Path) -> None:
    recipe = WarmStartSpec(max_steps=3, check_every=2, validation_problems=8, batch_size=4, eval_samples_per_problem=1, eval_problems=8)
    paths = [build_tiny_model(tmp_path / name, seed=0, warm=recipe, log=lambda _: None) for name in ("a", "b")]
    weights = [load_file(str(p / "model.safetensors")) for p in paths]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    record = json.loads((paths[0] / "bootstrap.json").read_text())
    assert record["seed"] == 0 and record["warm_start"]["steps"] == 3
    assert 0.0 <= record["warm_start"]["heldout_success_temperature_1"] <= 1.0
    assert record == json.loads((paths[1] / "bootstrap.json").read_text()) | {"build_seconds": record["build_seconds"]}


def test_ensure_builds_only_when_missing(untrained_tiny_model: Path, tmp_path: Path) -> None:
    assert is_built(untrained_tiny_model)
    stamp = (untrained_tiny_model / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(untrained_tiny_model) == untrained_tiny_model
    assert (untrained_tiny_model / "model.safetensors").stat().st_mtime_ns == stamp


def test_cli_refuses_to_overwrite_without_force(untrained_tiny_model: Path, repo_root: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rl_core", "bootstrap-tiny", str(untrained_tiny_model)],
                          capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert done.returncode == 0 and "--force" in done.stdout


def test_default_model_warm_start_lands_in_the_target_band(tiny_model: Path) -> None:
    # The demo needs room for RL: held-out success at temperature 1.0 between 10% and 60%.
    record = json.loads((tiny_model / "bootstrap.json").read_text())
    success = record["warm_start"]["heldout_success_temperature_1"]
    assert 0.10 <= success <= 0.60, success
    # ... and that room is reachable: worked solutions score far above quick guesses.
    behaviour = record["warm_start"]["heldout_behaviour_temperature_1"]
    assert behaviour["worked_success"] >= behaviour["guess_success"] + 0.3, behaviour
    assert 0.2 <= behaviour["guess_share"] <= 0.9, behaviour


def test_warm_start_targets_mix_worked_solutions_and_near_guesses() -> None:
    problem = make_arithmetic_problem([17, 8], ["+"])
    rng = random.Random(0)
    always_worked = [warm_start_target(problem, rng, WarmStartSpec(guess_share=0.0)) for _ in range(20)]
    assert always_worked == [problem.solution] * 20 and not is_quick_guess(problem.solution)
    guesses = [warm_start_target(problem, rng, WarmStartSpec(guess_share=1.0, guess_spread=3)) for _ in range(300)]
    assert all(is_quick_guess(g) for g in guesses)
    values = {int(g.removeprefix("\\boxed{").removesuffix("}")) for g in guesses}
    assert values == set(range(22, 29))  # 25 +- 3, every offset drawn, none further
    rng = random.Random(1)
    share = sum(is_quick_guess(warm_start_target(problem, rng, WarmStartSpec(guess_share=0.6))) for _ in range(2000)) / 2000
    assert 0.55 <= share <= 0.65


def test_describe_behaviour_splits_guesses_from_worked_answers() -> None:
    scored = [("\\boxed{3}", True), ("\\boxed{4}", False), ("\\boxed{5}", False), ("1 + 2: 1+2=3, so 3\n\\boxed{3}", True)]
    assert describe_behaviour(scored) == {"guess_share": 0.75, "guess_success": 1 / 3, "worked_success": 1.0}
