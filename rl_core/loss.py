"""The learning signal: group-relative advantages, token packing and the policy losses.

Data flows through this file in order:

1. `group_advantages` — the actor scores a group of attempts at one prompt and turns
   rewards into advantages relative to the group (GRPO-style, no value model).
2. `pack_micro_batches` — the trainer packs an optimizer batch of samples into
   micro-batches of at most `micro_batch_tokens` tokens. Sequences are concatenated
   into one row with `position_ids` restarting at 0 per sequence; HF attention turns
   restarting position ids into a block-diagonal causal mask (no cross-sequence
   attention, no padding compute).
3. `token_logprobs_from_logits` — log p(token t | tokens < t) and the entropy of the
   distribution that sampled token t, aligned with the input positions.
4. `policy_loss` — PipelineRL's truncated importance-weighted policy gradient (or
   GRPO's clipped ratio), plus an optional k3 KL to a reference model. Token terms are
   summed and divided by the number of sequences in the *optimizer* batch, so the
   gradient does not depend on how the batch was split into micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from rl_core.contracts import RolloutSample


# --- 1. advantages -----------------------------------------------------------------


def group_advantages(rewards: Sequence[float], normalize_std: bool = False, eps: float = 1e-6) -> list[float]:
    """Reward minus the group mean; divided by the group std (population) when asked.

    A group whose rewards are all equal gets all-zero advantages (also with std
    normalisation, where the std would be 0)."""
    if len(rewards) == 0:
        raise ValueError("group_advantages: a group needs at least one reward")
    mean = sum(rewards) / len(rewards)
    centred = [reward - mean for reward in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(value * value for value in centred) / len(centred))
    return [value / (std + eps) for value in centred]


# --- 2. packing --------------------------------------------------------------------


@dataclass
class MicroBatch:
    """One packed row of sequences. All tensors are [1, T] (T = total tokens).

    `loss_mask` marks completion tokens (the ones trained); the per-token tensors
    `behaviour_logprobs`, `advantages` and `token_versions` hold real values only where
    `loss_mask` is true."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_versions: torch.Tensor
    num_sequences: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


def _validate_sample(sample: RolloutSample) -> None:
    n = len(sample.completion_token_ids)
    if n == 0:
        raise ValueError(f"sample {sample.sample_id}: empty completion")
    if len(sample.behaviour_logprobs) != n or len(sample.token_versions) != n:
        raise ValueError(
            f"sample {sample.sample_id}: completion_token_ids ({n}), behaviour_logprobs "
            f"({len(sample.behaviour_logprobs)}) and token_versions ({len(sample.token_versions)}) differ in length"
        )
    if not sample.prompt_token_ids:
        raise ValueError(f"sample {sample.sample_id}: empty prompt")


def pack_micro_batches(samples: Sequence[RolloutSample], micro_batch_tokens: int) -> list[MicroBatch]:
    """First-fit-decreasing packing of samples into rows of at most `micro_batch_tokens`.

    A sample longer than the budget gets a row of its own (it is never truncated:
    dropping tokens would silently change the gradient)."""
    for sample in samples:
        _validate_sample(sample)
    order = sorted(range(len(samples)), key=lambda i: samples[i].num_tokens, reverse=True)
    bins: list[list[int]] = []
    bin_tokens: list[int] = []
    for index in order:
        size = samples[index].num_tokens
        for b, used in enumerate(bin_tokens):
            if used + size <= micro_batch_tokens:
                bins[b].append(index)
                bin_tokens[b] += size
                break
        else:
            bins.append([index])
            bin_tokens.append(size)
    return [_pack_row([samples[i] for i in members]) for members in bins]


def _pack_row(samples: Sequence[RolloutSample]) -> MicroBatch:
    input_ids: list[int] = []
    position_ids: list[int] = []
    loss_mask: list[bool] = []
    behaviour: list[float] = []
    advantages: list[float] = []
    versions: list[int] = []
    for sample in samples:
        prompt, completion = sample.prompt_token_ids, sample.completion_token_ids
        input_ids += list(prompt) + list(completion)
        position_ids += list(range(len(prompt) + len(completion)))
        loss_mask += [False] * len(prompt) + [True] * len(completion)
        behaviour += [0.0] * len(prompt) + [float(x) for x in sample.behaviour_logprobs]
        advantages += [0.0] * len(prompt) + [float(sample.advantage)] * len(completion)
        versions += [0] * len(prompt) + [int(v) for v in sample.token_versions]
    return MicroBatch(
        input_ids=torch.tensor([input_ids], dtype=torch.long),
        position_ids=torch.tensor([position_ids], dtype=torch.long),
        loss_mask=torch.tensor([loss_mask], dtype=torch.bool),
        behaviour_logprobs=torch.tensor([behaviour], dtype=torch.float32),
        advantages=torch.tensor([advantages], dtype=torch.float32),
        token_versions=torch.tensor([versions], dtype=torch.long),
        num_sequences=len(samples),
    )


# --- 3. log-probabilities ----------------------------------------------------------


def model_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run an HF causal LM (or a DeepSpeed engine wrapping one) without a KV cache and return
    [B, T] log p(token t | < t) and entropies aligned with input_ids. Every trainer backend
    and the reference model go through here, so the alignment is defined once."""
    input_ids = input_ids.to(device)
    output = model(
        input_ids=input_ids,
        attention_mask=None if attention_mask is None else attention_mask.to(device),
        position_ids=None if position_ids is None else position_ids.to(device),
        use_cache=False,
    )
    return token_logprobs_from_logits(output.logits, input_ids)


def token_logprobs_from_logits(logits: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position log p(input_ids[:, t] | < t) and entropy of that distribution.

    Both outputs are [B, T] and aligned with `input_ids`: position t uses the logits
    at t - 1. Position 0 has no prediction and gets 0 (it is always a prompt token,
    never trained). In a packed row the first token of each sequence is also a
    prompt token, so the cross-sequence prediction there is masked out by `loss_mask`."""
    logits = logits.float()
    log_probs = torch.log_softmax(logits[:, :-1, :], dim=-1)
    targets = input_ids[:, 1:].unsqueeze(-1)
    token_logp = log_probs.gather(-1, targets).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    pad = torch.zeros(logits.shape[0], 1, dtype=token_logp.dtype, device=token_logp.device)
    return torch.cat([pad, token_logp], dim=1), torch.cat([pad, entropy], dim=1)


# --- 4. losses ---------------------------------------------------------------------


@dataclass
class LossOutput:
    """The micro-batch loss (already divided by the optimizer batch's sequence count)
    and summed statistics the trainer aggregates over micro-batches."""

    loss: torch.Tensor
    num_tokens: int
    sum_entropy: float
    sum_weights: float  # importance weights (after truncation): for ESS
    sum_weights_sq: float
    sum_kl: float
    num_clipped: int  # tokens whose weight hit the truncation / clip bound


def policy_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch,
    num_sequences_in_step: int,
    kind: str = "pipelinerl",
    is_truncation: float = 5.0,
    clip_eps: float = 0.2,
    entropy: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossOutput:
    """Loss of one micro-batch; `logprobs` are the current policy's, aligned as in
    `token_logprobs_from_logits`.

    - `pipelinerl`: -sum_t min(exp(logp - behaviour_logp), is_truncation).detach() * A * logp
    - `grpo_clip`: -sum_t min(r * A, clip(r, 1 - eps, 1 + eps) * A), r = exp(logp - behaviour_logp)
    - k3 KL (`kl_coef > 0`): + kl_coef * sum_t (exp(ref - logp) - (ref - logp) - 1)
    Each sum runs over the completion tokens of the micro-batch and is divided by
    `num_sequences_in_step` (the sequences of the whole optimizer batch)."""
    if num_sequences_in_step <= 0:
        raise ValueError("policy_loss: num_sequences_in_step must be positive")
    mask = batch.loss_mask.to(logprobs.device)
    maskf = mask.float()
    behaviour = batch.behaviour_logprobs.to(logprobs.device)
    advantages = batch.advantages.to(logprobs.device)
    log_ratio = (logprobs - behaviour) * maskf  # zero outside the loss mask: exp() stays finite
    ratio = torch.exp(log_ratio)
    if kind == "pipelinerl":
        weights = torch.clamp(ratio, max=is_truncation).detach()
        per_token = -(weights * advantages * logprobs)
        clipped = (ratio.detach() > is_truncation) & mask
    elif kind == "grpo_clip":
        clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
        per_token = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
        weights = ratio.detach()
        clipped = ((ratio.detach() - 1.0).abs() > clip_eps) & mask
    else:
        raise ValueError(f"policy_loss: unknown loss kind {kind!r} (expected 'pipelinerl' or 'grpo_clip')")
    sum_kl = 0.0
    if kl_coef > 0.0:
        if reference_logprobs is None:
            raise ValueError("policy_loss: kl_coef > 0 needs reference_logprobs")
        delta = (reference_logprobs.to(logprobs.device).detach() - logprobs) * maskf
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
        sum_kl = float((kl * maskf).sum().detach())
    loss = (per_token * maskf).sum() / num_sequences_in_step
    masked_weights = weights * maskf
    return LossOutput(
        loss=loss,
        num_tokens=int(mask.sum()),
        sum_entropy=float((entropy.detach() * maskf).sum()) if entropy is not None else 0.0,
        sum_weights=float(masked_weights.sum()),
        sum_weights_sq=float((masked_weights * masked_weights).sum()),
        sum_kl=sum_kl,
        num_clipped=int(clipped.sum()),
    )


def effective_sample_size(sum_weights: float, sum_weights_sq: float, count: int) -> float:
    """Normalised ESS of importance weights: (sum w)^2 / (n * sum w^2), in (0, 1].
    1 means on-policy (all weights equal)."""
    if count == 0 or sum_weights_sq <= 0.0:
        return 1.0
    return (sum_weights * sum_weights) / (count * sum_weights_sq)
