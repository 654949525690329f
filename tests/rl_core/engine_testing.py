"""What the engine tests share: the tiny Qwen2 model (random weights), a Hugging Face copy of it
to check exactness against, prompts of mixed lengths, an engine, and the references
(`hf_greedy`, `continue_on_old_cache`). Test modules import the fixtures by name."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from rl_core.common.contracts import SamplingParams
from rl_core.inference.engine import EngineConfig, ReferenceEngine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def model_dir(untrained_tiny_model: Path) -> Path:
    return untrained_tiny_model


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = ["1+1", "What is 12 * 7 - 3? Think step by step.", "9", "The sum of 4 and 5 is", "14-2*3+8-1+0*9+17-4-4"]
    return [tokenizer.encode(text) for text in texts]


@pytest.fixture()
def engine(model_dir: Path):
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=8, initial_cache_len=16))
    engine.start()
    yield engine
    engine.stop()


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
    return output[0, len(prompt) :].tolist()


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def perturbed_state(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point()
    }


def continue_on_old_cache(old, new, prompt: list[int], tokens: list[int], switch: int) -> list[int]:
    """Reference for a greedy sequence whose tokens from index `switch` on were sampled after
    a weight update: old weights build the cache up to the last version-0 token, then the new
    weights continue greedily from that same cache (nothing recomputed)."""
    with torch.no_grad():
        cache = DynamicCache(config=old.config)
        old(torch.tensor([prompt + tokens[: switch - 1]]), past_key_values=cache, use_cache=True)
        expected = list(tokens[:switch])
        next_input = tokens[switch - 1]
        while len(expected) < len(tokens):
            logits = new(torch.tensor([[next_input]]), past_key_values=cache, use_cache=True).logits[0, -1]
            next_input = int(logits.argmax())
            expected.append(next_input)
    return expected
