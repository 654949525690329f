"""`build-model`: published shapes, randomly initialised, loadable by HF and the engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_core.models import model_shapes
from rl_core.models.model_shapes import SHAPES, build_model


def test_parameter_counts_match_the_architecture_and_the_published_sizes() -> None:
    from transformers import Qwen2ForCausalLM

    from rl_core.models.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(0, 1024)
    for shape in SHAPES.values():
        with torch.device("meta"):
            model = Qwen2ForCausalLM(model_shapes.qwen2_config(shape, tokenizer, "bfloat16"))
        assert sum(p.numel() for p in model.parameters()) == shape.num_parameters, shape.name
        assert model.config.vocab_size >= len(tokenizer)
    # The model cards' figures: 0.49B, 1.54B, 7.61B parameters.
    assert round(SHAPES["qwen2.5-0.5b"].num_parameters / 1e9, 2) == 0.49
    assert round(SHAPES["qwen2.5-1.5b"].num_parameters / 1e9, 2) == 1.54
    assert round(SHAPES["qwen2.5-7b"].num_parameters / 1e9, 2) == 7.62


def test_built_model_loads_with_hf_init_statistics(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = build_model("tiny", tmp_path / "m", dtype="bfloat16", seed=3)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert model.dtype == torch.bfloat16 and model.config.model_type == "qwen2"
    assert model.config.eos_token_id == tokenizer.eos_token_id
    layer = model.model.layers[0]
    assert torch.equal(layer.input_layernorm.weight, torch.ones_like(layer.input_layernorm.weight))
    assert torch.count_nonzero(layer.self_attn.q_proj.bias) == 0
    assert abs(float(layer.mlp.up_proj.weight.float().std()) - 0.02) < 0.002
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as the shape says
    with torch.no_grad():
        logits = model(torch.tensor([tokenizer.encode("Compute 1 + 2.")])).logits
    assert torch.isfinite(logits).all()
    record = json.loads((directory / "model_shape.json").read_text())
    assert record["name"] == "tiny" and record["dtype"] == "bfloat16" and record["seed"] == 3


def test_large_models_are_sharded_with_an_index_and_load_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    whole = AutoModelForCausalLM.from_pretrained(build_model("tiny", tmp_path / "whole"))
    monkeypatch.setattr(model_shapes, "SHARD_BYTES", 2 * 2**20)
    sharded_dir = build_model("tiny", tmp_path / "sharded")
    index = json.loads((sharded_dir / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (sharded_dir / "model.safetensors").exists()
    sharded = AutoModelForCausalLM.from_pretrained(sharded_dir)
    for (name, a), (_, b) in zip(whole.named_parameters(), sharded.named_parameters()):
        assert torch.equal(a, b), name


def test_cli_builds_and_refuses_an_unknown_shape(tmp_path: Path, repo_root: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "rl_core", "build-model", "--shape", "tiny", str(tmp_path / "m")],
                          cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["num_parameters"] == SHAPES["tiny"].num_parameters
    refused = subprocess.run([sys.executable, "-m", "rl_core", "build-model", "--shape", "qwen9", str(tmp_path / "x")],
                             cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--shape" in refused.stderr and "qwen2.5-0.5b" in refused.stderr
