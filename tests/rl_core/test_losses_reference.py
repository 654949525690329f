"""Every `trainer.loss` x `trainer.is_correction` equals an independent reference written from its
paper's formula: the product's `trainer.train_step` on packed micro-batches (a group's prompt once,
completions that begin alike sharing their prefix, several micro-batches, stacked rows) against a
plain loop over the sequences, one unpacked forward each, on the same real (untrained) tiny model.

The behaviour logprobs are real: each token's comes from the version of the weights that sampled it
(the model perturbed once per version it lags, a sequence's tokens spanning two versions as with
in-flight updates), at the sampling temperature, so the ratios are what staleness makes them. Each
case runs at a temperature and a lag spread; the clip ranges, bounds and M2PO's tau are set from
the batch's own ratios so that every clip side, mask and bound really binds (asserted), and never
within reach of float noise.

The references below use nothing of rl_core's loss code: only torch and the formulas.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from rl_core.config.run_config import RunConfig
from rl_core.common.contracts import RolloutSample
from tests.rl_core.test_attention_exactness import grouped_samples, packed_loss_and_gradients

CURRENT_VERSION = 6
PERTURBATION = 0.1  # per lagged version, times each parameter's std: log ratios up to ~1
MAX_NEW_TOKENS = 16  # dr_grpo's constant normaliser L
# (temperature, largest lag in the batch): fresh, middling and stale data at three temperatures.
SCENARIOS = [(0.7, 1), (1.0, 3), (1.3, 6)]
CASES = [
    ("pipelinerl", "tis"), ("pipelinerl", "mis"), ("pipelinerl", "none"),
    ("grpo_clip", "none"), ("grpo_clip", "mis"),
    ("cispo", "tis"),
    ("gspo", "none"),
    ("dapo", "none"), ("dapo", "mis"),
    ("dr_grpo", "none"),
    ("m2po", "none"),
]
LOSS_RELATIVE_TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 5e-5  # relative to the norm, and of the largest entry (packed sdpa vs eager)


# --- the data: a batch sampled by lagged weights ---------------------------------------------


@functools.lru_cache(maxsize=None)
def load_eager(model_path: Path) -> Any:
    """The reference's model: stock transformers, eager attention, one per session (its gradients
    are cleared before each use)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, attn_implementation="eager")


@functools.lru_cache(maxsize=None)
def product_backend(model_path: Path) -> Any:
    """The product's backend, one per session: its optimizer never steps (the gradient is read
    before it), so its weights stay those of the reference's model."""
    from rl_core.trainer.torch_backend import TorchBackend

    backend = TorchBackend(model_path)
    backend.optimizer_step = lambda: {"grad_norm": float("nan")}
    backend.version = CURRENT_VERSION
    return backend


def completion_logprobs(model: Any, sample: RolloutSample, temperature: float) -> torch.Tensor:
    """log softmax(logits / T) of each completion token, from one forward of prompt + completion."""
    ids = torch.tensor([sample.prompt_token_ids + sample.completion_token_ids])
    logits = model(input_ids=ids, use_cache=False).logits[0].float() / temperature
    start = len(sample.prompt_token_ids)
    predicted = torch.log_softmax(logits[start - 1:-1], dim=-1)
    return predicted.gather(1, torch.tensor(sample.completion_token_ids).unsqueeze(1)).squeeze(1)


@functools.lru_cache(maxsize=None)
def lagged_batch(model_path: Path, temperature: float, max_lag: int) -> tuple[RolloutSample, ...]:
    """grouped_samples' batch (shared prompts and prefixes) plus an all-equal group (advantage 0:
    counted, never computed), its behaviour logprobs sampled by the versions that lag."""
    rng = random.Random(max_lag)
    samples = grouped_samples()
    prompt = [rng.randrange(10, 500) for _ in range(4)]
    for member in range(2):
        completion = [rng.randrange(10, 500) for _ in range(5)]
        samples.append(RolloutSample(
            sample_id=f"zero-{member}", group_id="gz", prompt_id="pz", prompt_token_ids=prompt,
            completion_token_ids=completion, behaviour_logprobs=[-6.0] * 5, token_versions=[0] * 5,
            reward=1.0, success=True, advantage=0.0))
    model = copy.deepcopy(load_eager(model_path))
    torch.manual_seed(max_lag)
    current = copy.deepcopy(model.state_dict())
    direction = {name: torch.randn_like(value) * value.float().std().nan_to_num(0.0) * PERTURBATION
                 for name, value in current.items()}
    behaviour: dict[int, list[torch.Tensor]] = {}
    with torch.no_grad():
        for version in range(CURRENT_VERSION - max_lag, CURRENT_VERSION + 1):
            lag = CURRENT_VERSION - version
            model.load_state_dict({name: value + lag * direction[name] for name, value in current.items()})
            behaviour[version] = [completion_logprobs(model, sample, temperature) for sample in samples]
    for index, sample in enumerate(samples):
        # Started `first` versions ago at least one behind, the weights changing once mid-sequence
        # (an in-flight update), so its last tokens may be current.
        first = rng.randrange(CURRENT_VERSION - max_lag, CURRENT_VERSION)
        switch = rng.randrange(0, len(sample.completion_token_ids) + 1)
        versions = [min(CURRENT_VERSION, first + (t >= switch)) for t in range(len(sample.completion_token_ids))]
        sample.token_versions = versions
        sample.behaviour_logprobs = [float(behaviour[v][index][t]) for t, v in enumerate(versions)]
    return tuple(samples)


# --- the references: the papers' formulas, one sequence at a time ----------------------------


def reference_loss(kind: str, correction: str, knobs: dict[str, float], sequences: list[dict[str, Any]]) -> tuple[torch.Tensor, dict[str, int]]:
    """-J for one optimizer batch. Each sequence: `logp` (current policy, with gradient), `mu` (the
    inference engine's logprobs), `A`. N = sequences, T = completion tokens, all of the batch (the
    zero-advantage group too). Returns the loss and what was clipped / masked, in tokens."""
    n_seq = len(sequences)
    n_tok = sum(len(s["mu"]) for s in sequences)
    counts = {"low": 0, "high": 0, "masked": 0}
    total = torch.zeros(())
    C = knobs.get("is_truncation", 5.0)
    if kind == "m2po":
        # M2PO (Zheng et al. 2025): over the batch's trained tokens, drop the token of largest
        # (log r)^2 while their mean exceeds tau; keep the rest.
        entries = [(float(s["logp"][t] - s["mu"][t]) ** 2, i, t)
                   for i, s in enumerate(sequences) if s["A"] != 0.0 for t in range(len(s["mu"]))]
        while entries and sum(e[0] for e in entries) / len(entries) > knobs["m2po_tau"]:
            entries.remove(max(entries))
            counts["masked"] += 1
        kept = {(i, t) for _, i, t in entries}
    for i, s in enumerate(sequences):
        logp, mu, A = s["logp"], s["mu"], s["A"]
        if A == 0.0:
            continue  # every term below is a multiple of A
        if kind == "gspo":
            # GSPO: s_i = (pi/mu)^(1/|y|), J = 1/N sum_i min(s_i A, clip(s_i, 1-el, 1+eh) A).
            s_i = torch.exp((logp - mu).sum() / len(mu))
            low, high = 1 - knobs["gspo_eps_low"], 1 + knobs["gspo_eps_high"]
            total = total + torch.minimum(s_i * A, torch.clamp(s_i, low, high) * A) / n_seq
            counts["high"] += len(mu) * int(float(s_i) > high and A > 0)
            counts["low"] += len(mu) * int(float(s_i) < low and A < 0)
            continue
        for t in range(len(mu)):
            ratio = torch.exp(logp[t] - mu[t])
            rho = float(ratio.detach())
            if kind == "pipelinerl":
                # PipelineRL: sum_t w A log pi / N, w the (corrected) importance weight, no gradient.
                if correction == "tis":
                    weight = min(rho, C)
                    counts["high"] += rho > C
                elif correction == "mis":
                    weight = rho if rho <= C else 0.0
                    counts["masked"] += rho > C
                else:
                    weight = 1.0
                total = total + weight * A * logp[t] / n_seq
            elif kind == "cispo":
                # CISPO: sum_t sg(clip(r, 1-el, 1+eh)) A log pi / T.
                high = 1 + knobs["cispo_eps_high"]
                low = 1 - knobs["cispo_eps_low"] if knobs.get("cispo_eps_low") is not None else -math.inf
                weight = min(max(rho, low), high)
                counts["high"] += rho > high
                counts["low"] += rho < low
                total = total + weight * A * logp[t] / n_tok
            elif kind in ("grpo_clip", "dapo", "dr_grpo"):
                eps_low = knobs["clip_eps"]
                eps_high = knobs["clip_eps_high"] if kind == "dapo" else knobs["clip_eps"]
                if correction == "mis" and rho > C:
                    counts["masked"] += 1
                    continue
                term = torch.minimum(ratio * A, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * A)
                counts["high"] += rho > 1 + eps_high and A > 0
                counts["low"] += rho < 1 - eps_low and A < 0
                # GRPO as the product defines it: / N; DAPO token-level: / T; Dr. GRPO: / (N * L).
                divisor = {"grpo_clip": n_seq, "dapo": n_tok, "dr_grpo": n_seq * MAX_NEW_TOKENS}[kind]
                total = total + term / divisor
            elif kind == "m2po":
                # M2PO: 1/T sum_t M_t r_t A (no clip: the mask is the trust region).
                if (i, t) in kept:
                    total = total + ratio * A / n_tok
    return -total, counts


# --- choosing bounds that bind -----------------------------------------------------------------


def between(values: list[float], share: float) -> float:
    """A value with `share` of `values` below it, halfway between two neighbours (no value is
    within float noise of it); half the value when there is only one."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0] / 2
    k = min(len(ordered) - 2, max(0, int(share * len(ordered))))
    return (ordered[k] + ordered[k + 1]) / 2


def binding_knobs(tokens: list[tuple[float, float]], sequences: list[tuple[float, float]]) -> dict[str, float]:
    """Clip ranges and bounds from the batch's (log ratio, advantage) per token and per sequence,
    measured before the step, such that each side clips some tokens and leaves others: the low
    side of a clip binds where A < 0 and r < 1, the high side where A > 0 and r > 1."""
    low_side = [1 - math.exp(x) for x, a in tokens if a < 0 and x < -1e-9]
    high_side = [math.exp(x) - 1 for x, a in tokens if a > 0 and x > 1e-9]
    above = [math.exp(x) - 1 for x, _ in tokens if x > 1e-9]
    below = [1 - math.exp(x) for x, _ in tokens if x < -1e-9]
    symmetric = min(between(low_side, 0.6), between(high_side, 0.6))
    knobs: dict[str, float] = {
        "is_truncation": 1 + between(above, 0.8),  # mis / tis: the top fifth past C
        "clip_eps": symmetric,
        "clip_eps_high": between(high_side, 0.5),
        "cispo_eps_low": between(below, 0.7),
        "cispo_eps_high": between(above, 0.6),
        "gspo_eps_low": between([1 - math.exp(x) for x, a in sequences if a < 0 and x < -1e-9], 0.5),
        "gspo_eps_high": between([math.exp(x) - 1 for x, a in sequences if a > 0 and x > 1e-9], 0.5),
    }
    # tau: every unlagged token (log ratio 0) and 60% of the others kept, halfway between that
    # prefix's mean of (log r)^2 and the next one's.
    squared = sorted(x * x for x, _ in tokens)
    zeros = sum(1 for x in squared if x < 1e-12)
    k = zeros + int(0.6 * (len(squared) - zeros))
    kept_mean, next_mean = sum(squared[:k]) / k, sum(squared[:k + 1]) / (k + 1)
    assert next_mean - kept_mean > 1e-3 * next_mean  # far from float noise
    knobs["m2po_tau"] = (kept_mean + next_mean) / 2
    return knobs


def config_for(kind: str, correction: str, temperature: float, knobs: dict[str, float]) -> RunConfig:
    trainer = {"loss": kind, "is_correction": correction, "grad_clip": 1e6, "micro_batch_tokens": 96, "row_tokens": 48,
               "share_completion_prefixes": True, "warmup_steps": 0, **knobs}
    return RunConfig.model_validate({"sampling": {"temperature": temperature, "max_new_tokens": MAX_NEW_TOKENS},
                                     "trainer": trainer})


def reference_sequences(model: Any, samples: Sequence[RolloutSample], temperature: float) -> list[dict[str, Any]]:
    return [{"logp": completion_logprobs(model, sample, temperature), "mu": torch.tensor(sample.behaviour_logprobs),
             "A": sample.advantage} for sample in samples]


@functools.lru_cache(maxsize=None)
def scenario_knobs(model_path: Path, temperature: float, max_lag: int) -> dict[str, float]:
    """Bounds that bind on this scenario's batch (`binding_knobs`), from the ratios before the step."""
    with torch.no_grad():
        sequences = reference_sequences(load_eager(model_path), lagged_batch(model_path, temperature, max_lag), temperature)
    informative = [s for s in sequences if s["A"] != 0.0]
    return binding_knobs([(float(x), s["A"]) for s in informative for x in s["logp"] - s["mu"]],
                         [(float((s["logp"] - s["mu"]).mean()), s["A"]) for s in informative])


def reference_step(model_path: Path, samples: list[RolloutSample], kind: str, correction: str, temperature: float,
                   knobs: dict[str, float]) -> dict[str, Any]:
    model = load_eager(model_path)
    model.zero_grad(set_to_none=True)
    sequences = reference_sequences(model, samples, temperature)
    loss, counts = reference_loss(kind, correction, knobs, sequences)
    loss.backward()
    gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return {"loss": float(loss.detach()), "gradient": gradient, "counts": counts}


@pytest.mark.parametrize("temperature,max_lag", SCENARIOS)
@pytest.mark.parametrize("kind,correction", CASES)
def test_loss_equals_its_reference_on_packed_batches(
    untrained_tiny_model: Path, kind: str, correction: str, temperature: float, max_lag: int,
) -> None:
    samples = [copy.deepcopy(sample) for sample in lagged_batch(untrained_tiny_model, temperature, max_lag)]
    knobs = scenario_knobs(untrained_tiny_model, temperature, max_lag)
    reference = reference_step(untrained_tiny_model, samples, kind, correction, temperature, knobs)
    config = config_for(kind, correction, temperature, knobs)
    backend = product_backend(untrained_tiny_model)
    backend.model.zero_grad(set_to_none=True)
    packed = packed_loss_and_gradients(backend, backend.model.parameters, samples, config)

    assert abs(packed["loss"] - reference["loss"]) <= LOSS_RELATIVE_TOLERANCE * abs(reference["loss"]), (packed["loss"], reference["loss"])
    difference = (packed["gradient"] - reference["gradient"]).abs()
    assert float(difference.norm()) <= GRADIENT_TOLERANCE * float(reference["gradient"].norm())
    assert float(difference.max()) <= GRADIENT_TOLERANCE * float(reference["gradient"].abs().max())
    # What the case exists for really happened in this batch.
    counts = reference["counts"]
    binds = {"tis": counts["high"] > 0, "mis": counts["masked"] > 0, "none": True}[correction]
    if kind in ("grpo_clip", "dapo", "dr_grpo", "gspo", "cispo"):
        binds = binds and counts["low"] > 0 and counts["high"] > 0
    if kind == "m2po":
        binds = counts["masked"] > 0
    assert binds, counts
