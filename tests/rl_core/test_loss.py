"""Loss, advantages and packing against hand-computed values, plus one real model:
a packed row must give the same log-probs as each sequence run on its own."""

from __future__ import annotations

import math

import pytest
import torch

from rl_core.contracts import RolloutSample
from rl_core.loss import (
    effective_sample_size,
    group_advantages,
    pack_micro_batches,
    policy_loss,
    token_logprobs_from_logits,
)


def make_sample(sample_id: str, prompt: list[int], completion: list[int], behaviour: list[float], advantage: float, versions: list[int] | None = None) -> RolloutSample:
    return RolloutSample(
        sample_id=sample_id,
        group_id="g",
        prompt_id="p",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        behaviour_logprobs=behaviour,
        token_versions=versions or [0] * len(completion),
        reward=0.0,
        success=False,
        advantage=advantage,
    )


def test_group_advantages_mean_and_std() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    # mean 0.25, population std sqrt(0.1875) = 0.4330
    normed = group_advantages([1.0, 0.0, 0.0, 0.0], normalize_std=True)
    assert normed[0] == pytest.approx(0.75 / math.sqrt(0.1875), rel=1e-4)
    assert normed[1] == pytest.approx(-0.25 / math.sqrt(0.1875), rel=1e-4)
    assert group_advantages([1.0, 1.0, 1.0], normalize_std=True) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([])


def test_packing_respects_budget_and_restarts_positions() -> None:
    samples = [
        make_sample("a", [1, 2, 3], [4, 5], [-1.0, -1.0], 1.0),  # 5 tokens
        make_sample("b", [1, 2], [6], [-1.0], -1.0),  # 3 tokens
        make_sample("c", [1, 2, 3, 4], [7, 8, 9], [-1.0] * 3, 0.5),  # 7 tokens
    ]
    batches = pack_micro_batches(samples, micro_batch_tokens=8)
    assert sorted(b.num_tokens for b in batches) == [7, 8]
    assert sum(b.num_sequences for b in batches) == 3
    row = next(b for b in batches if b.num_tokens == 8)  # a + b packed together, longest first
    assert row.input_ids.tolist() == [[1, 2, 3, 4, 5, 1, 2, 6]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert row.loss_mask.tolist() == [[False, False, False, True, True, False, False, True]]
    assert row.advantages.tolist() == [[0, 0, 0, 1, 1, 0, 0, -1]]
    # A sample over the budget is kept whole in its own row, never truncated.
    big = pack_micro_batches([samples[2]], micro_batch_tokens=4)
    assert [b.num_tokens for b in big] == [7]


def test_packing_rejects_misaligned_sample() -> None:
    bad = make_sample("bad", [1], [2, 3], [-1.0], 1.0)
    with pytest.raises(ValueError, match="bad.*behaviour_logprobs"):
        pack_micro_batches([bad], 64)


def test_token_logprobs_alignment_and_entropy() -> None:
    # Vocab 2; logits at position 0 predict token 1: p = softmax([0, ln 3]) = [0.25, 0.75].
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    input_ids = torch.tensor([[0, 1]])
    logp, entropy = token_logprobs_from_logits(logits, input_ids)
    assert logp.shape == (1, 2)
    assert logp[0, 0].item() == 0.0
    assert logp[0, 1].item() == pytest.approx(math.log(0.75))
    assert entropy[0, 1].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def test_pipelinerl_loss_hand_computed() -> None:
    # One sequence, prompt [9], completion of 2 tokens; behaviour logprobs -1, -2.
    sample = make_sample("s", [9], [1, 2], [-1.0, -2.0], advantage=2.0)
    (batch,) = pack_micro_batches([sample], 64)
    # Current logprobs: token 1 at -1 + ln 2 (ratio 2), token 2 at -2 + ln 10 (ratio 10 -> truncated to 5).
    logp = torch.tensor([[0.0, -1.0 + math.log(2.0), -2.0 + math.log(10.0)]], requires_grad=True)
    out = policy_loss(logp, batch, num_sequences_in_step=4, kind="pipelinerl", is_truncation=5.0)
    expected = -(2.0 * 2.0 * logp[0, 1].item() + 5.0 * 2.0 * logp[0, 2].item()) / 4
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    out.loss.backward()
    # Weights are detached: d loss / d logp = -w * A / num_sequences.
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -2.0 * 2.0 / 4, -5.0 * 2.0 / 4])
    assert out.num_tokens == 2 and out.num_clipped == 1
    assert out.sum_weights == pytest.approx(7.0) and out.sum_weights_sq == pytest.approx(29.0)
    assert effective_sample_size(out.sum_weights, out.sum_weights_sq, out.num_tokens) == pytest.approx(49 / 58)


def test_grpo_clip_loss_hand_computed() -> None:
    sample = make_sample("s", [9], [1, 2], [0.0, 0.0], advantage=1.0)
    (batch,) = pack_micro_batches([sample], 64)
    # ratios 1.5 (clipped to 1.2 for A>0) and 0.5 (unclipped: min(0.5, 0.8) = 0.5).
    logp = torch.tensor([[0.0, math.log(1.5), math.log(0.5)]], requires_grad=True)
    out = policy_loss(logp, batch, num_sequences_in_step=1, kind="grpo_clip", clip_eps=0.2)
    assert out.loss.item() == pytest.approx(-(1.2 + 0.5), rel=1e-5)
    out.loss.backward()
    # The clipped token has no gradient; the other has d(-r)/dlogp = -r = -0.5.
    assert logp.grad.tolist()[0] == pytest.approx([0.0, 0.0, -0.5])
    assert out.num_clipped == 2


def test_k3_kl_term() -> None:
    sample = make_sample("s", [9], [1], [-1.0], advantage=0.0)
    (batch,) = pack_micro_batches([sample], 64)
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1.5]])
    out = policy_loss(logp, batch, 2, kind="pipelinerl", reference_logprobs=ref, kl_coef=0.1)
    delta = -0.5
    k3 = math.exp(delta) - delta - 1
    assert out.loss.item() == pytest.approx(0.1 * k3 / 2, rel=1e-5)
    assert out.sum_kl == pytest.approx(k3, rel=1e-5)
    with pytest.raises(ValueError, match="reference_logprobs"):
        policy_loss(logp, batch, 2, kl_coef=0.1)
    with pytest.raises(ValueError, match="unknown loss kind"):
        policy_loss(logp, batch, 2, kind="ppo")


def test_packed_row_matches_separate_forward_passes() -> None:
    """HF attention must isolate packed sequences (position ids restart) — otherwise
    the packed loss would be wrong. A real (random) Qwen2 model checks it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = Qwen2ForCausalLM(config).eval()
    a = make_sample("a", [3, 4, 5], [6, 7], [-1.0, -1.0], 1.0)
    b = make_sample("b", [8, 9, 13], [10, 11, 12], [-1.0] * 3, 1.0)
    (row,) = pack_micro_batches([a, b], 64)
    with torch.no_grad():
        packed_logits = model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False).logits
        packed_logp, _ = token_logprobs_from_logits(packed_logits, row.input_ids)
        separate = []
        for sample in (b, a):  # packing puts the longer sequence first
            ids = torch.tensor([sample.prompt_token_ids + sample.completion_token_ids])
            logp, _ = token_logprobs_from_logits(model(input_ids=ids, use_cache=False).logits, ids)
            separate.append(logp[0])
    expected = torch.cat(separate)
    mask = row.loss_mask[0]
    assert torch.allclose(packed_logp[0][mask], expected[mask], atol=1e-5)
