"""The trainer on multi-turn samples (issue 34): only the policy's tokens are trained (mask 1), each
with its own behaviour logprob; a tool turn's tokens (mask 0, logprob 0.0, version -1) are context.

The reference is computed independently, turn by turn: for each model turn one unpacked forward of
everything before it (prompt, earlier turns, tool output) plus the turn, its tokens' logprobs
taken, and the papers' formulas (`test_losses_reference.reference_loss`) over those tokens only.
The product packs the same samples (a group's prompt once, shared prefixes, several micro-batches)."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_core.common.contracts import TOOL_TOKEN_VERSION, RolloutSample
from tests.rl_core.test_attention_exactness import grouped_samples, packed_loss_and_gradients
from tests.rl_core.test_losses_reference import (
    CURRENT_VERSION, GRADIENT_TOLERANCE, LOSS_RELATIVE_TOLERANCE, config_for, load_eager, product_backend, reference_loss,
)

TEMPERATURE = 0.9


def with_tool_turns(samples: list[RolloutSample], seed: int = 3) -> list[RolloutSample]:
    """Each completion becomes model tokens, a tool turn of 2-5 tokens, more model tokens (the
    group's shared prefixes kept); versions lag 0-3 and change inside a trajectory."""
    rng = random.Random(seed)
    out = []
    for sample in samples:
        sample = copy.deepcopy(sample)
        cut = rng.randrange(1, len(sample.completion_token_ids) + 1)
        tool = [rng.randrange(10, 500) for _ in range(rng.randrange(2, 6))]
        tail = [rng.randrange(10, 500) for _ in range(rng.randrange(1, 5))]
        head = sample.completion_token_ids[:cut]
        first = rng.randrange(CURRENT_VERSION - 3, CURRENT_VERSION + 1)
        after = min(CURRENT_VERSION, first + rng.randrange(0, 2))  # an update may land during the tool call
        sample.completion_token_ids = head + tool + tail
        sample.behaviour_logprobs = ([rng.uniform(-6.8, -5.6) for _ in head] + [0.0] * len(tool)
                                     + [rng.uniform(-6.8, -5.6) for _ in tail])
        sample.token_versions = [first] * len(head) + [TOOL_TOKEN_VERSION] * len(tool) + [after] * len(tail)
        sample.completion_mask = [1] * len(head) + [0] * len(tool) + [1] * len(tail)
        sample.metadata = {"turns": [{"kind": "model", "start": 0, "end": cut},
                                     {"kind": "tool", "start": cut, "end": cut + len(tool), "status": "ok", "seconds": 0.1},
                                     {"kind": "model", "start": cut + len(tool), "end": len(sample.completion_token_ids)}]}
        out.append(sample)
    return out


def per_turn_reference(model: Any, sample: RolloutSample, temperature: float) -> dict[str, Any]:
    """logp and mu of the sample's model-turn tokens, one unpacked forward per model turn."""
    logps, mus = [], []
    for turn in sample.metadata["turns"]:
        if turn["kind"] != "model":
            continue
        context = sample.prompt_token_ids + sample.completion_token_ids[:turn["start"]]
        tokens = sample.completion_token_ids[turn["start"]:turn["end"]]
        logits = model(input_ids=torch.tensor([context + tokens]), use_cache=False).logits[0].float() / temperature
        predicted = torch.log_softmax(logits[len(context) - 1:-1], dim=-1)
        logps.append(predicted.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1))
        mus += sample.behaviour_logprobs[turn["start"]:turn["end"]]
    return {"logp": torch.cat(logps), "mu": torch.tensor(mus), "A": sample.advantage}


@pytest.mark.parametrize("kind,correction", [("pipelinerl", "tis"), ("pipelinerl", "none"), ("dapo", "none")])
def test_packed_loss_with_tool_turns_equals_a_per_turn_reference(untrained_tiny_model: Path, kind: str, correction: str) -> None:
    samples = with_tool_turns(grouped_samples())
    knobs = {"is_truncation": 2.0, "clip_eps": 0.2, "clip_eps_high": 0.28}
    model = load_eager(untrained_tiny_model)
    model.zero_grad(set_to_none=True)
    sequences = [per_turn_reference(model, sample, TEMPERATURE) for sample in samples]
    loss, _ = reference_loss(kind, correction, knobs, sequences)  # dapo: / the model tokens only
    loss.backward()
    loss = loss.detach()
    reference_gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    backend = product_backend(untrained_tiny_model)
    backend.model.zero_grad(set_to_none=True)
    packed = packed_loss_and_gradients(backend, backend.model.parameters, samples, config_for(kind, correction, TEMPERATURE, knobs))
    assert abs(packed["loss"] - float(loss)) <= LOSS_RELATIVE_TOLERANCE * abs(float(loss)), (packed["loss"], float(loss))
    difference = (packed["gradient"] - reference_gradient).abs()
    assert float(difference.norm()) <= GRADIENT_TOLERANCE * float(reference_gradient.norm())

    if correction != "none":
        return  # a tool token's ratio to its 0.0 logprob is tiny, so its truncated weight hides it
    # The tool tokens matter: training them too gives another loss (the test would catch a mask ignored).
    unmasked = copy.deepcopy(samples)
    for sample in unmasked:
        sample.completion_mask = None
        sample.token_versions = [max(v, CURRENT_VERSION - 3) for v in sample.token_versions]
    backend.model.zero_grad(set_to_none=True)
    wrong = packed_loss_and_gradients(backend, backend.model.parameters, unmasked, config_for(kind, correction, TEMPERATURE, knobs))
    assert abs(wrong["loss"] - float(loss)) > 1e-3 * abs(float(loss))


def test_an_update_inside_a_trajectory_keeps_per_token_versions_and_lag_ignores_tool_tokens(untrained_tiny_model: Path) -> None:
    from rl_core.trainer.loop import train_step
    from rl_core.trainer.loss import pack_micro_batches
    from rl_core.trainer.losses import LossSettings, step_normaliser

    samples = with_tool_turns(grouped_samples())
    config = config_for("pipelinerl", "tis", TEMPERATURE, {"is_truncation": 2.0})
    batches = pack_micro_batches(samples, config.trainer.micro_batch_tokens, config.trainer.packed_row_tokens())
    # Every trained term carries its own token's version; no tool token is trained.
    trained_versions = sorted(int(v) for b in batches for v in b.token_versions[b.loss_mask])
    assert trained_versions == sorted(v for s in samples for v, m in zip(s.token_versions, s.completion_mask) if m)
    assert TOOL_TOKEN_VERSION not in trained_versions
    assert sum(int(b.term_mask.sum()) for b in batches) == sum(len(s.completion_token_ids) for s in samples)
    # DAPO's token normaliser counts the policy's tokens only.
    assert step_normaliser(LossSettings(kind="dapo"), samples) == sum(sum(s.completion_mask) for s in samples)

    backend = product_backend(untrained_tiny_model)
    backend.model.zero_grad(set_to_none=True)
    stats, _ = train_step(backend, samples, config)
    lags = [CURRENT_VERSION - v for s in samples for v in s.policy_versions()]
    assert stats.lag_max == max(lags) == 3  # a tool token's -1 would read as lag 7
    assert stats.num_tokens == len(lags)
    assert sum(stats.lag_counts) == len(lags) and stats.lag_counts[:4] == [lags.count(k) for k in range(4)]
