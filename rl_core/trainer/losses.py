"""The policy objectives (`trainer.loss`), the importance correction against the inference
engine's logprobs (`trainer.is_correction`), and what a step needs around them: the
normaliser, M2PO's batch-wide mask and the statistics each objective is read by.

Every objective scores the terms of a packed micro-batch (`loss.MicroBatch`). A term's ratio is
r = exp(logp - mu), mu the logprob the inference engine reported for the sampled token: older
weights when the token lags (PipelineRL's in-flight updates), so r carries both the staleness and
any engine/trainer mismatch. The trainer takes one optimizer step per batch, so PPO's pi_old is the
very weights being trained (a ratio to it is 1 in value): every clipped objective here clips r,
the ratio to the behaviour policy. The formulas, with their papers, are the `trainer.loss` help in
config.py; tests/rl_core/test_losses_reference.py checks each against a per-sequence reference.

A loss is divided by a per-step constant (`step_normaliser`: sequences, tokens, or sequences x the
token budget), never by what one micro-batch holds, so the gradient does not depend on how the
batch was split into micro-batches or ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Sequence

import torch

from rl_core.config.run_config import IS_CORRECTIONS_BY_LOSS, RunConfig
from rl_core.common.contracts import RolloutSample, TrainerBackend
from rl_core.trainer.loss import MicroBatch

KL_LOG_RATIO_BOUND = 20.0  # |log(ref / policy)| before exp: exp(20) is finite in float32
KL_TOKEN_BOUND = 10.0  # the k3 estimate of one token, at most

# Objectives divided by the completion tokens of the batch (DAPO's token-level normalisation;
# CISPO and M2PO as their papers write them); the others by its sequences.
TOKEN_NORMALISED = ("cispo", "dapo", "m2po")
CLIPPED_RATIO = ("grpo_clip", "dr_grpo", "dapo")


@dataclass(frozen=True)
class LossSettings:
    """The knobs of the objectives, as `trainer.*` names them (`from_config`)."""

    kind: str = "pipelinerl"
    is_correction: str | None = None  # None: the loss's own (config.IS_CORRECTIONS_BY_LOSS, first)
    is_truncation: float = 5.0
    clip_eps: float = 0.2
    clip_eps_high: float = 0.28
    cispo_eps_low: float | None = None
    cispo_eps_high: float = 4.0
    gspo_eps_low: float = 3e-4
    gspo_eps_high: float = 4e-4
    m2po_tau: float = 0.04
    kl_coef: float = 0.0
    max_new_tokens: int = 48  # dr_grpo's constant normaliser

    def __post_init__(self) -> None:
        if self.kind not in IS_CORRECTIONS_BY_LOSS:
            raise ValueError(f"policy_loss: unknown loss kind {self.kind!r} (expected one of {', '.join(IS_CORRECTIONS_BY_LOSS)})")
        if self.is_correction is None:
            object.__setattr__(self, "is_correction", IS_CORRECTIONS_BY_LOSS[self.kind][0])
        if self.is_correction not in IS_CORRECTIONS_BY_LOSS[self.kind]:
            raise ValueError(f"policy_loss: is_correction {self.is_correction!r} is not allowed with {self.kind!r}")

    @classmethod
    def from_config(cls, config: RunConfig) -> LossSettings:
        t = config.trainer
        values = {f.name: getattr(t, f.name) for f in fields(cls) if f.name not in ("kind", "is_correction", "max_new_tokens")}
        return cls(kind=t.loss, is_correction=t.importance_correction(), max_new_tokens=config.sampling.max_new_tokens, **values)

    def ratio_bounds(self) -> tuple[float, float]:
        """[low, high] of a clipped-ratio objective's clip."""
        high = self.clip_eps_high if self.kind == "dapo" else self.clip_eps
        return 1.0 - self.clip_eps, 1.0 + high


def step_normaliser(settings: LossSettings, samples: Sequence[RolloutSample], world_size: int = 1) -> float:
    """What every micro-batch's loss is divided by, for an optimizer batch of `samples` (every
    sample of the step, zero-advantage ones included although they are not computed). With
    several ranks each divides by its share (DeepSpeed averages the ranks' gradients), so the
    average is the whole batch's loss."""
    if not samples:
        raise ValueError("step_normaliser: an empty batch")
    if settings.kind in TOKEN_NORMALISED:
        total = float(sum(sample.num_trained_tokens for sample in samples))  # tool output is not trained
    elif settings.kind == "dr_grpo":
        total = float(len(samples) * settings.max_new_tokens)
    else:
        total = float(len(samples))
    return total / world_size


@dataclass
class LossOutput:
    """The micro-batch loss (already divided by the step's normaliser) and summed statistics
    the trainer aggregates over micro-batches and ranks (`LossTotals`)."""

    loss: torch.Tensor
    num_tokens: int
    sum_entropy: float
    sum_weights: float  # the tokens' effective importance weights: for ESS
    sum_weights_sq: float
    sum_kl: float
    num_clipped: int  # num_clipped_low + num_clipped_high
    num_clipped_low: int = 0  # tokens whose term the clip (or the weight's lower bound) decided
    num_clipped_high: int = 0  # ... its upper side (pipelinerl tis: the weight hit the truncation)
    num_masked: int = 0  # tokens left out of the loss (mis, m2po)
    sum_log_ratio_sq: float = 0.0  # (log r)^2 summed over every token, before any mask
    num_sequences: int = 0  # gspo: sequences and their ratios
    sum_seq_ratio: float = 0.0
    sum_seq_ratio_sq: float = 0.0


def _k3_kl(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, maskf: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(policy || reference) per token: exp(d) - d - 1, d = ref - logp. exp() of a
    large log-ratio overflows to inf (then NaN gradients): d is bounded before, the estimate after."""
    delta = (reference_logprobs.to(logprobs.device).detach() - logprobs) * maskf
    delta = torch.clamp(delta, min=-KL_LOG_RATIO_BOUND, max=KL_LOG_RATIO_BOUND)
    return torch.clamp(torch.exp(delta) - delta - 1.0, max=KL_TOKEN_BOUND)


def policy_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch,
    normaliser: float,
    settings: LossSettings = LossSettings(),
    entropy: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> LossOutput:
    """Loss of one micro-batch under `settings.kind`; `logprobs` are the current policy's for the
    batch's terms ([R, K], `loss.token_logprobs_from_logits`). `keep` ([R, K] bool) is M2PO's
    batch-wide mask (`second_moment_keep_masks`). A k3 KL to `reference_logprobs` is added per
    token when `settings.kl_coef > 0`. Everything is summed and divided by `normaliser`."""
    if normaliser <= 0:
        raise ValueError("policy_loss: the normaliser must be positive")
    kind, correction, bound = settings.kind, settings.is_correction, settings.is_truncation
    device = logprobs.device
    mask = batch.loss_mask.to(device)
    maskf = mask.float()
    advantages = batch.advantages.to(device)
    log_ratio = (logprobs - batch.behaviour_logprobs.to(device)) * maskf  # zero outside the mask: exp() stays finite
    ratio = torch.exp(log_ratio)
    r = ratio.detach()
    nothing = torch.zeros_like(mask)
    clipped_low, clipped_high, masked = nothing, nothing, nothing
    out = LossOutput(loss=torch.zeros((), device=device), num_tokens=int(mask.sum()), sum_entropy=0.0, sum_weights=0.0,
                     sum_weights_sq=0.0, sum_kl=0.0, num_clipped=0)
    if kind in ("pipelinerl", "cispo"):
        if kind == "cispo":
            low = None if settings.cispo_eps_low is None else 1.0 - settings.cispo_eps_low
            high = 1.0 + settings.cispo_eps_high
            weights = torch.clamp(r, min=low, max=high)
            clipped_high = r > high
            clipped_low = r < low if low is not None else nothing
        elif correction == "tis":
            weights = torch.clamp(r, max=bound)
            clipped_high = r > bound
        elif correction == "mis":
            masked = r > bound
            weights = r
        else:
            weights = torch.ones_like(r)
        per_token = -(weights * advantages * logprobs)
    elif kind in CLIPPED_RATIO:
        low, high = settings.ratio_bounds()
        per_token = -torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
        weights = r
        # A token counts as clipped when the clipped term is the one the minimum takes (its
        # gradient is cut): above the band with A > 0, below it with A < 0 (TRL's meaning).
        clipped_high = (r > high) & (advantages > 0)
        clipped_low = (r < low) & (advantages < 0)
        if correction == "mis":
            masked = r > bound
    elif kind == "m2po":
        per_token = -(ratio * advantages)
        weights = r
        if keep is None:
            raise ValueError("policy_loss: m2po needs the batch's keep mask (second_moment_keep_masks)")
        masked = ~keep.to(device)
    elif kind == "gspo":
        per_token, weights = _gspo_terms(log_ratio, advantages, mask, batch.term_sequence.to(device), settings, out)
    else:  # LossSettings refuses any other kind
        raise AssertionError(kind)
    masked = masked & mask
    trained = (mask & ~masked).float()
    total = (per_token * trained).sum()
    if settings.kl_coef > 0.0:
        if reference_logprobs is None:
            raise ValueError("policy_loss: kl_coef > 0 needs reference_logprobs")
        kl = _k3_kl(logprobs, reference_logprobs, maskf)
        total = total + settings.kl_coef * (kl * maskf).sum()
        out.sum_kl = float((kl * maskf).sum().detach())
    out.loss = total / normaliser
    effective = weights.detach() * trained
    out.sum_weights = float(effective.sum())
    out.sum_weights_sq = float((effective * effective).sum())
    out.sum_entropy = float((entropy.detach() * maskf).sum()) if entropy is not None else 0.0
    if kind != "gspo":  # gspo counts its clipped sequences' tokens itself
        out.num_clipped_low = int((clipped_low & mask).sum())
        out.num_clipped_high = int((clipped_high & mask).sum())
    out.num_clipped = out.num_clipped_low + out.num_clipped_high
    out.num_masked = int(masked.sum())
    out.sum_log_ratio_sq = float(log_ratio.detach().pow(2).sum())
    return out


def _gspo_terms(
    log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, term_sequence: torch.Tensor,
    settings: LossSettings, out: LossOutput,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's sequence objective laid on the terms: each sequence's -min(s A, clip(s) A) is put on
    its first term (a sum over terms then sums sequences), and the per-token weights returned for
    ESS are the sequence ratio on each of its tokens. Fills `out`'s sequence and clip counts."""
    flat_mask = mask.reshape(-1)
    positions = torch.nonzero(flat_mask).squeeze(1)
    sequences, which = torch.unique(term_sequence.reshape(-1)[positions], return_inverse=True)
    count = len(sequences)
    ones = torch.ones(len(positions), device=log_ratio.device)
    lengths = torch.zeros(count, device=log_ratio.device).index_add(0, which, ones)
    mean_log_ratio = torch.zeros(count, device=log_ratio.device).index_add(0, which, log_ratio.reshape(-1)[positions]) / lengths
    seq_ratio = torch.exp(mean_log_ratio)
    # Every term of a sequence holds its advantage: the mean is that value.
    seq_advantage = torch.zeros(count, device=log_ratio.device).index_add(0, which, advantages.reshape(-1)[positions]) / lengths
    low, high = 1.0 - settings.gspo_eps_low, 1.0 + settings.gspo_eps_high
    objective = torch.minimum(seq_ratio * seq_advantage, torch.clamp(seq_ratio, low, high) * seq_advantage)
    first = torch.full((count,), len(positions), dtype=torch.long, device=log_ratio.device).scatter_reduce(
        0, which, torch.arange(len(positions), device=log_ratio.device), reduce="amin")
    per_term = torch.zeros(flat_mask.numel(), device=log_ratio.device).index_put(
        (positions[first],), -objective).view(mask.shape)
    s = seq_ratio.detach()
    high_side = (s > high) & (seq_advantage > 0)
    low_side = (s < low) & (seq_advantage < 0)
    out.num_clipped_high = int(lengths[high_side].sum())
    out.num_clipped_low = int(lengths[low_side].sum())
    out.num_sequences = count
    out.sum_seq_ratio = float(s.sum())
    out.sum_seq_ratio_sq = float((s * s).sum())
    weights = torch.zeros(flat_mask.numel(), device=log_ratio.device).index_put((positions,), s[which]).view(mask.shape)
    return per_term, weights


# --- M2PO's batch-wide mask ---------------------------------------------------------


def second_moment_threshold(squared_log_ratios: torch.Tensor, tau: float) -> float:
    """M2PO's mask as a bound: the tokens of largest (log r)^2 are masked until the mean over the
    rest is at most `tau`. Removing the largest value never raises the mean, so the kept tokens
    are the k smallest for the largest k whose mean is <= tau: the returned value is the largest
    kept one (inf when nothing needs masking, -1 when even the smallest alone is above tau)."""
    if squared_log_ratios.numel() == 0:
        return float("inf")
    ordered = torch.sort(squared_log_ratios.double()).values
    running_mean = torch.cumsum(ordered, 0) / torch.arange(1, len(ordered) + 1, dtype=torch.float64)
    kept = int((running_mean <= tau).sum())
    if kept == len(ordered):
        return float("inf")
    return float(ordered[kept - 1]) if kept else -1.0


def gather_by_sum(values: torch.Tensor, reduce: Callable[[list[float], str], list[float]], rank: int, world_size: int) -> torch.Tensor:
    """Every rank's `values` concatenated (rank order), with only the trainer's sum/max reduction:
    each rank writes its values into its own slot of a zero buffer and the buffers are summed."""
    if world_size == 1:
        return values
    counts = [0.0] * world_size
    counts[rank] = float(len(values))
    counts = reduce(counts, "sum")
    longest = int(max(counts))
    buffer = torch.zeros(world_size * longest, dtype=torch.float64)
    buffer[rank * longest: rank * longest + len(values)] = values.double().cpu()
    summed = torch.tensor(reduce(buffer.tolist(), "sum"), dtype=torch.float64)
    return torch.cat([summed[r * longest: r * longest + int(counts[r])] for r in range(world_size)])


def second_moment_keep_masks(
    log_ratios: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], tau: float,
    gather: Callable[[torch.Tensor], torch.Tensor] = lambda values: values,
) -> tuple[list[torch.Tensor], float]:
    """M2PO's keep mask for every micro-batch of the step, from the log ratios of all of them
    (`gather` adds the other ranks' tokens): the second moment is the optimizer batch's, over the
    tokens it computes. Returns the masks and the bound on (log r)^2 they keep."""
    local = torch.cat([(lr.detach()[m]).double().pow(2).cpu() for lr, m in zip(log_ratios, masks)]) if log_ratios else torch.zeros(0)
    bound = second_moment_threshold(gather(local), tau)
    return [(lr.detach().double().pow(2) <= bound) & m for lr, m in zip(log_ratios, masks)], bound


def m2po_keep_masks(
    backend: TrainerBackend, micro_batches: Sequence[MicroBatch], padding: int, temperature: float, tau: float,
    reduce: Callable[[list[float], str], list[float]], rank: int = 0, world_size: int = 1,
) -> list[torch.Tensor]:
    """M2PO's masks for a step: a forward without gradient over every micro-batch first (the mask
    depends on the whole batch's log ratios, and each micro-batch's backward runs before the next
    one is scored), on every rank as many forwards as the busiest one (ZeRO-3 gathers are
    collective). Costs one forward per micro-batch more than the other objectives."""
    log_ratios = []
    with torch.no_grad():
        for batch in micro_batches:
            logprobs, _ = backend.token_logprobs(batch.input_ids, batch.attention_mask, batch.position_ids, temperature,
                                                 batch.logit_source, batch.packed_layout, batch.target_ids)
            log_ratios.append(logprobs.detach().cpu().float() - batch.behaviour_logprobs)
        for _ in range(padding):
            backend.token_logprobs(torch.zeros((1, 2), dtype=torch.long), None, torch.arange(2).unsqueeze(0))
    masks, _ = second_moment_keep_masks(log_ratios, [batch.loss_mask for batch in micro_batches], tau,
                                        lambda values: gather_by_sum(values, reduce, rank, world_size))
    return masks


# --- the step's statistics ----------------------------------------------------------


@dataclass
class LossTotals:
    """The objectives' own statistics summed over a step's micro-batches (and ranks): what
    `metrics` turns into the metric lines the run page charts."""

    tokens: float = 0.0
    clipped_low: float = 0.0
    clipped_high: float = 0.0
    masked: float = 0.0
    log_ratio_sq: float = 0.0
    sequences: float = 0.0
    seq_ratio: float = 0.0
    seq_ratio_sq: float = 0.0

    def add(self, out: LossOutput) -> None:
        self.tokens += out.num_tokens
        self.clipped_low += out.num_clipped_low
        self.clipped_high += out.num_clipped_high
        self.masked += out.num_masked
        self.log_ratio_sq += out.sum_log_ratio_sq
        self.sequences += out.num_sequences
        self.seq_ratio += out.sum_seq_ratio
        self.seq_ratio_sq += out.sum_seq_ratio_sq

    def reduced(self, reduce: Callable[[list[float], str], list[float]]) -> LossTotals:
        return LossTotals(*reduce([getattr(self, f.name) for f in fields(self)], "sum"))

    def metrics(self, settings: LossSettings) -> dict[str, float]:
        """Clip fractions per side and the log ratio's second moment for every loss; the masked
        share where tokens can be masked (mis, m2po); the sequence ratio's mean and spread (gspo)."""
        tokens = max(1.0, self.tokens)
        metrics = {
            "train/clip_low_fraction": self.clipped_low / tokens,
            "train/clip_high_fraction": self.clipped_high / tokens,
            "train/log_ratio_m2": self.log_ratio_sq / tokens,
        }
        if settings.kind == "m2po" or settings.is_correction == "mis":
            metrics["train/masked_fraction"] = self.masked / tokens
        if settings.kind == "gspo" and self.sequences:
            mean = self.seq_ratio / self.sequences
            metrics["train/seq_ratio_mean"] = mean
            metrics["train/seq_ratio_std"] = max(0.0, self.seq_ratio_sq / self.sequences - mean * mean) ** 0.5
        return metrics


def effective_sample_size(sum_weights: float, sum_weights_sq: float, count: int) -> float:
    """Normalised ESS of importance weights: (sum w)^2 / (n * sum w^2), in (0, 1].
    1 means on-policy (all weights equal)."""
    if count == 0 or sum_weights_sq <= 0.0:
        return 1.0
    return (sum_weights * sum_weights) / (count * sum_weights_sq)
