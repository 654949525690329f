"""Loss, advantages and packing against hand-computed values, plus one real model:
a packed row must give the same log-probs as each sequence run on its own."""

from __future__ import annotations

import math

import pytest
import torch

from rl_core.envs.advantages import group_advantages
from rl_core.common.contracts import RolloutSample
from rl_core.trainer.loss import model_token_logprobs, pack_micro_batches, token_logprobs_from_logits
from rl_core.trainer.losses import LossSettings, effective_sample_size, policy_loss


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


def test_an_all_equal_group_gets_exactly_zero_advantages_whatever_the_reward() -> None:
    """0.1 summed eight times and divided by 8 is not 0.1: the centred rewards were 1e-17, not
    0, so the group was neither dropped by the actor nor skipped by the trainer."""
    assert group_advantages([0.1] * 8) == [0.0] * 8
    assert group_advantages([0.1] * 8, normalize_std=True) == [0.0] * 8
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([])


def test_packing_shares_a_prompt_and_restarts_positions_per_unit() -> None:
    samples = [
        make_sample("a", [1, 2, 3], [4, 5], [-1.0, -1.0], 1.0),
        make_sample("b", [1, 2], [6], [-1.0], -1.0),  # another prompt: its own unit
        make_sample("c", [1, 2, 3], [7, 8, 9], [-1.0] * 3, 0.5),  # a's prompt: shares it
    ]
    (batch,) = pack_micro_batches(samples, micro_batch_tokens=64, row_tokens=16)
    assert batch.num_sequences == 3
    # One row: a's prompt once, then a's and c's completions; then b's unit.
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 7, 8, 9, 1, 2, 6]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5, 0, 1, 2]]
    # The terms: each sample's tokens in sample_order, each scored by the node before it (a
    # completion's first token by its prompt's last).
    assert batch.sample_order == [0, 2, 1]
    assert batch.target_ids.tolist() == [[4, 5, 7, 8, 9, 6]]
    assert batch.logit_source.tolist() == [[2, 3, 2, 5, 6, 9]]
    assert batch.advantages.tolist() == [[1, 1, 0.5, 0.5, 0.5, -1]]
    assert batch.loss_mask.all()
    allowed = batch.attention_mask[0, 0]
    assert allowed[5].tolist()[:8] == [True, True, True, False, False, True, False, False]  # c sees the prompt, not a
    assert not allowed[10, :8].any() and allowed[10, 8:].all()  # b's unit sees nothing of the other


def test_completions_that_begin_alike_are_computed_once_and_scored_by_each_sample() -> None:
    samples = [
        make_sample("a", [1, 2, 3], [4, 5], [-1.0, -2.0], 1.0),
        make_sample("c", [1, 2, 3], [4, 8, 9], [-1.5, -1.0, -1.0], -0.5, versions=[3, 4, 4]),
        make_sample("d", [1, 2, 3], [4, 5, 7], [-1.0, -2.5, -3.0], 0.5),
    ]
    (batch,) = pack_micro_batches(samples, micro_batch_tokens=64, row_tokens=16)
    # The trie in depth-first order: the prompt, the shared 4, then 5 (a, d) with d's 7, then c's 8 9.
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 7, 8, 9]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 4, 5]]
    # Every sample scores every one of its tokens, with its own values, at the node before it.
    assert batch.target_ids.tolist() == [[4, 5, 4, 8, 9, 4, 5, 7]]
    assert batch.logit_source.tolist() == [[2, 3, 2, 3, 6, 2, 3, 4]]
    assert batch.advantages.tolist() == [[1, 1, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5]]
    assert batch.behaviour_logprobs.tolist() == [[-1.0, -2.0, -1.5, -1.0, -1.0, -1.0, -2.5, -3.0]]
    assert batch.token_versions.tolist() == [[0, 0, 3, 4, 4, 0, 0, 0]]
    allowed = batch.attention_mask[0, 0]
    assert allowed[6].tolist() == [True, True, True, True, False, False, True, False]  # c's 8: not a's 5
    assert allowed[5].tolist() == [True, True, True, True, True, True, False, False]  # d's 7: the shared 4 5
    # Without sharing each completion is laid out whole.
    (plain,) = pack_micro_batches(samples, micro_batch_tokens=64, row_tokens=16, share_prefixes=False)
    assert plain.input_ids.tolist() == [[1, 2, 3, 4, 5, 4, 8, 9, 4, 5, 7]]
    assert plain.target_ids.tolist() == batch.target_ids.tolist()


def test_packing_respects_the_budget_and_never_truncates() -> None:
    samples = [make_sample(f"s{i}", [1, 2, i + 10], [4] * (i + 1), [-1.0] * (i + 1), 1.0) for i in range(6)]
    batches = pack_micro_batches(samples, micro_batch_tokens=12, row_tokens=12, share_prompts=False)
    assert sum(b.num_sequences for b in batches) == 6
    assert all(b.num_tokens <= 12 for b in batches if b.input_ids.shape[0] > 1)
    assert sum(int(b.loss_mask.sum()) for b in batches) == sum(i + 1 for i in range(6))
    # A sample over both budgets is kept whole in a row of its own.
    big = make_sample("big", [1, 2, 3], [4] * 20, [-1.0] * 20, 1.0)
    (alone,) = pack_micro_batches([big], micro_batch_tokens=8, row_tokens=8)
    assert alone.input_ids.shape == (1, 23) and int(alone.loss_mask.sum()) == 20


def test_packing_rejects_misaligned_sample() -> None:
    bad = make_sample("bad", [1], [2, 3], [-1.0], 1.0)
    with pytest.raises(ValueError, match="bad.*behaviour_logprobs"):
        pack_micro_batches([bad], 64)


def test_token_logprobs_score_the_temperature_scaled_distribution() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    input_ids = torch.tensor([[0, 1]])
    for temperature in (0.5, 1.6):
        logp, entropy = token_logprobs_from_logits(logits, input_ids, temperature)
        p = torch.softmax(logits[0, 0] / temperature, dim=-1)
        assert logp[0, 1].item() == pytest.approx(math.log(p[1].item()))
        assert entropy[0, 1].item() == pytest.approx(-(p * p.log()).sum().item())
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_from_logits(logits, input_ids, 0.0)


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
    # The loss scores the completion's tokens (the batch's terms), not the prompt.
    assert batch.target_ids.tolist() == [[1, 2]] and batch.logit_source.tolist() == [[0, 1]]
    # Current logprobs: token 1 at -1 + ln 2 (ratio 2), token 2 at -2 + ln 10 (ratio 10 -> truncated to 5).
    logp = torch.tensor([[-1.0 + math.log(2.0), -2.0 + math.log(10.0)]], requires_grad=True)
    out = policy_loss(logp, batch, 4, LossSettings(kind="pipelinerl", is_truncation=5.0))
    expected = -(2.0 * 2.0 * logp[0, 0].item() + 5.0 * 2.0 * logp[0, 1].item()) / 4
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)
    out.loss.backward()
    # Weights are detached: d loss / d logp = -w * A / num_sequences.
    assert logp.grad.tolist()[0] == pytest.approx([-2.0 * 2.0 / 4, -5.0 * 2.0 / 4])
    assert out.num_tokens == 2 and out.num_clipped == 1
    assert out.sum_weights == pytest.approx(7.0) and out.sum_weights_sq == pytest.approx(29.0)
    assert effective_sample_size(out.sum_weights, out.sum_weights_sq, out.num_tokens) == pytest.approx(49 / 58)


def test_grpo_clip_loss_hand_computed() -> None:
    sample = make_sample("s", [9], [1, 2], [0.0, 0.0], advantage=1.0)
    (batch,) = pack_micro_batches([sample], 64)
    # ratios 1.5 (clipped to 1.2 for A>0) and 0.5 (unclipped: min(0.5, 0.8) = 0.5).
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    out = policy_loss(logp, batch, 1, LossSettings(kind="grpo_clip", is_correction="none", clip_eps=0.2))
    assert out.loss.item() == pytest.approx(-(1.2 + 0.5), rel=1e-5)
    out.loss.backward()
    # The clipped token has no gradient; the other has d(-r)/dlogp = -r = -0.5.
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5])
    # Only the token whose clipped term the minimum takes counts as clipped (TRL's meaning):
    # ratio 0.5 with A > 0 left the band on the side that does not clip.
    assert out.num_clipped == 1


def test_grpo_clip_fraction_counts_the_side_that_clips_for_the_advantage_sign() -> None:
    ratios = [1.5, 0.5, 1.1]
    for advantage, clipped in ((1.0, 1), (-1.0, 1)):
        sample = make_sample("s", [9], [1, 2, 3], [0.0, 0.0, 0.0], advantage=advantage)
        (batch,) = pack_micro_batches([sample], 64)
        logp = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
        out = policy_loss(logp, batch, 1, LossSettings(kind="grpo_clip", is_correction="none", clip_eps=0.2))
        out.loss.backward()
        grads = logp.grad.tolist()[0]
        # A token counts as clipped exactly when its gradient is cut off by the clip.
        assert out.num_clipped == clipped == sum(1 for g in grads if g == 0.0)


def test_k3_kl_term() -> None:
    sample = make_sample("s", [9], [1], [-1.0], advantage=0.0)
    (batch,) = pack_micro_batches([sample], 64)
    logp = torch.tensor([[-1.0]], requires_grad=True)
    ref = torch.tensor([[-1.5]])
    out = policy_loss(logp, batch, 2, LossSettings(kl_coef=0.1), reference_logprobs=ref)
    delta = -0.5
    k3 = math.exp(delta) - delta - 1
    assert out.loss.item() == pytest.approx(0.1 * k3 / 2, rel=1e-5)
    assert out.sum_kl == pytest.approx(k3, rel=1e-5)
    with pytest.raises(ValueError, match="reference_logprobs"):
        policy_loss(logp, batch, 2, LossSettings(kl_coef=0.1))


def test_k3_kl_stays_finite_for_a_huge_log_ratio() -> None:
    sample = make_sample("s", [9], [1, 2], [-1.0, -1.0], advantage=1.0)
    (batch,) = pack_micro_batches([sample], 64)
    logp = torch.tensor([[-200.0, -1.0]], requires_grad=True)  # the policy all but rules token 1 out
    ref = torch.tensor([[-0.1, -1.0]])  # ... which the reference finds likely: exp(199.9) overflows
    out = policy_loss(logp, batch, 1, LossSettings(kl_coef=0.1), reference_logprobs=ref)
    out.loss.backward()
    assert math.isfinite(out.loss.item()) and math.isfinite(out.sum_kl)
    assert all(math.isfinite(g) for g in logp.grad.flatten().tolist())
    with pytest.raises(ValueError, match="unknown loss kind"):
        LossSettings(kind="ppo")


@pytest.mark.parametrize("share_prompts,share_prefixes", [(True, True), (True, False), (False, False)])
def test_packed_rows_match_separate_forward_passes(share_prompts: bool, share_prefixes: bool) -> None:
    """The packed layout (shared prompts, shared completion starts, 4-D mask, stacked rows with
    padding) must give each completion token the log-prob a forward of that sequence alone
    gives — otherwise the packed loss would be wrong. A real (random) Qwen2 model checks it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = Qwen2ForCausalLM(config).eval()
    samples = [
        make_sample("a", [3, 4, 5], [6, 7], [-1.0, -1.0], 1.0),
        make_sample("b", [8, 9, 13], [10, 11, 12], [-1.0] * 3, 1.0),
        make_sample("c", [3, 4, 5], [14, 15, 16, 17], [-1.0] * 4, 1.0),  # shares a's prompt
        make_sample("d", [20, 21], [22], [-1.0], 1.0),
        make_sample("e", [3, 4, 5], [6, 7, 30, 31], [-1.0] * 4, 1.0),  # begins as a does
        make_sample("f", [3, 4, 5], [6, 40], [-1.0] * 2, 1.0),  # diverges after a's first token
    ]
    batches = pack_micro_batches(samples, micro_batch_tokens=64, row_tokens=12, share_prompts=share_prompts,
                                 share_prefixes=share_prefixes)
    assert sum(b.input_ids.shape[0] for b in batches) > 1  # several rows, padded
    packed: dict[str, list[float]] = {}
    with torch.no_grad():
        for batch in batches:
            logp, _ = model_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.position_ids, "cpu",
                                           1.0, batch.logit_source, None, batch.target_ids)
            flat = logp[batch.loss_mask].tolist()  # row by row, sample by sample (sample_order)
            for index in batch.sample_order:
                n = len(samples[index].completion_token_ids)
                packed[samples[index].sample_id], flat = flat[:n], flat[n:]
        for sample in samples:
            ids = torch.tensor([sample.prompt_token_ids + sample.completion_token_ids])
            logp, _ = token_logprobs_from_logits(model(input_ids=ids, use_cache=False).logits, ids)
            assert packed[sample.sample_id] == pytest.approx(logp[0, len(sample.prompt_token_ids):].tolist(), abs=1e-5)
    computed = sum(int((batch.input_ids != 0).sum()) for batch in batches)
    # Shared: [3 4 5] once with 6 7 30 31 14 15 16 17 40 under it (e's 6 7 and f's 6 are a's), then b 6, d 3.
    assert (computed == 12 + 6 + 3) == share_prefixes
