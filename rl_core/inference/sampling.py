"""Token sampling shared by the engine's decode and speculative-verify paths, plus the
checks a request passes before it may enter the engine.

The logprob reported for a sampled token is its log-probability under the
distribution it was actually drawn from (temperature- and top-p-adjusted); for
temperature 0 it is the plain log-softmax of the argmax. Token t of a request is
drawn with the t-th uniform of its own `random.Random` stream (`PositionUniforms`),
whatever else shares its batch and whether the token was decoded alone or verified
as part of a draft: a seeded request gives the same tokens with or without
speculation (up to float rounding between forwards of different widths).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rl_core.common.contracts import SamplingParams


class PositionUniforms:
    """The uniforms one sequence draws its tokens with, by token position: position t always
    gets the t-th value of `random.Random(seed)`, however many positions a step verifies."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._values: list[float] = []

    def at(self, position: int) -> float:
        while len(self._values) <= position:
            self._values.append(self._rng.random())
        return self._values[position]

    def span(self, start: int, count: int) -> list[float]:
        """The uniforms of positions start .. start + count - 1."""
        self.at(start + count - 1)
        return self._values[start : start + count]


def adjusted_probs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`[N, V]` float logits -> `[N, V]` probabilities after temperature and top-p.

    `temperature` and `top_p` are `[N]`; temperatures must be > 0 here (greedy
    rows never come through this function).
    """
    probs = torch.softmax(logits.float() / temperature.unsqueeze(-1), dim=-1)
    if bool((top_p < 1.0).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p: a token survives if
        # the mass strictly before it is still below top_p (the first always does).
        sorted_probs = sorted_probs.masked_fill(mass_before >= top_p.unsqueeze(-1), 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: `[N, V]` probabilities (need not sum to 1) and `[N]` uniforms in [0, 1) -> `[N]` ids.

    Zero-probability tokens can never be drawn: `right=True` picks the first
    index whose cumulative mass exceeds the target, and a zero entry never
    increases it.
    """
    cdf = probs.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], uniforms: list[float]
) -> tuple[list[int], list[float]]:
    """Sample one token per row; returns (token ids, their logprobs)."""
    count = logits.shape[0]
    tokens = [0] * count
    logprobs = [0.0] * count
    greedy_rows = [row for row in range(count) if temperatures[row] <= 0.0]
    sampled_rows = [row for row in range(count) if temperatures[row] > 0.0]
    if greedy_rows:
        if len(greedy_rows) == count:
            rows = logits.float()
        else:
            rows = logits.index_select(0, torch.tensor(greedy_rows, dtype=torch.long, device=logits.device)).float()
        best = rows.argmax(dim=-1)
        best_logprobs = torch.log_softmax(rows, dim=-1).gather(-1, best.unsqueeze(-1)).squeeze(-1)
        for row, token, logprob in zip(greedy_rows, best.tolist(), best_logprobs.tolist()):
            tokens[row] = token
            logprobs[row] = logprob
    if sampled_rows:
        index = torch.tensor(sampled_rows, dtype=torch.long, device=logits.device)
        rows = logits.index_select(0, index)
        temperature = torch.tensor([temperatures[row] for row in sampled_rows], device=logits.device)
        top_p = torch.tensor([top_ps[row] for row in sampled_rows], device=logits.device)
        probs = adjusted_probs(rows, temperature, top_p)
        chosen = draw(probs, torch.tensor([uniforms[row] for row in sampled_rows], device=logits.device))
        chosen_logprobs = probs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).log()
        for row, token, logprob in zip(sampled_rows, chosen.tolist(), chosen_logprobs.tolist()):
            tokens[row] = token
            logprobs[row] = logprob
    return tokens, logprobs


def verify_draft(
    logits: torch.Tensor, draft: list[int], temperature: float, top_p: float, uniforms: list[float]
) -> tuple[list[int], list[float], int]:
    """Lossless check of one drafted continuation against the target model.

    `logits[i]` is the target's next-token distribution after the sequence's
    last token plus `draft[:i]` (so there are `len(draft) + 1` rows). Returns
    (tokens to append, their logprobs, number of draft tokens accepted); the
    tokens are the accepted draft prefix plus one token from the target.

    Each position draws its token exactly as plain decoding would (the argmax;
    or an inverse-CDF draw with that position's uniform, `uniforms[i]`), and the
    draft is accepted while it agrees with those draws. The emitted tokens are
    therefore the ones decoding without a draft gives. Against a point-mass draft
    this accepts token x with probability p(x) and on a mismatch yields a token
    from p with x removed, renormalised: the acceptance rate and the distribution
    of speculative sampling, with one uniform per position instead of two.
    `uniforms` needs `len(draft) + 1` values (more are ignored).
    """
    return verify_drafts(logits.unsqueeze(0), [draft], [temperature], [top_p], [uniforms])[0]


def verify_drafts(
    logits: torch.Tensor, drafts: list[list[int]], temperatures: list[float], top_ps: list[float],
    uniforms: list[list[float]],
) -> list[tuple[list[int], list[float], int]]:
    """`verify_draft` for a batch of rows in a few tensor operations (the per-row version cost
    a dozen small ops per row and step). `logits` is `[B, keep, V]`, left-aligned so that row
    b's distributions are its last `len(drafts[b]) + 1` columns; `uniforms[b][i]` draws row b's
    position i (unused for greedy rows)."""
    batch, keep, vocab = logits.shape
    device = logits.device
    # Every (row, column) a row verifies: its last len(draft) + 1 columns.
    rows: list[int] = []
    columns: list[int] = []
    for b, draft in enumerate(drafts):
        offset = keep - len(draft) - 1
        rows += [b] * (len(draft) + 1)
        columns += range(offset, keep)
    temperature = torch.tensor([temperatures[b] for b in rows], device=device)
    greedy = temperature <= 0.0
    picked = logits[rows, columns].float()  # [N, V]
    drawn = picked.argmax(dim=-1)
    logprobs = torch.log_softmax(picked, dim=-1)
    if not bool(greedy.all()):
        sampled = (~greedy).nonzero().squeeze(-1)
        top_p = torch.tensor([top_ps[b] for b in rows], device=device)[sampled]
        probs = adjusted_probs(picked[sampled], temperature[sampled], top_p)
        position_uniforms = [uniforms[b][i] for b, draft in enumerate(drafts) if temperatures[b] > 0.0 for i in range(len(draft) + 1)]
        chosen = draw(probs, torch.tensor(position_uniforms, device=device))
        drawn[sampled] = chosen
        logprobs[sampled] = probs.log()
    drawn_list = drawn.tolist()
    chosen_logprobs = logprobs.gather(-1, drawn.unsqueeze(-1)).squeeze(-1).tolist()
    outcomes: list[tuple[list[int], list[float], int]] = []
    position = 0
    for draft in drafts:
        tokens = drawn_list[position : position + len(draft) + 1]
        accepted = 0
        while accepted < len(draft) and tokens[accepted] == draft[accepted]:
            accepted += 1
        outcomes.append((tokens[: accepted + 1], chosen_logprobs[position : position + accepted + 1], accepted))
        position += len(draft) + 1
    return outcomes


def width_groups(widths: list[int], overhead_tokens: int) -> list[list[int]]:
    """Split rows (indices into `widths`, their query lengths) into forwards. A forward pads
    every row to its widest one, so it costs about `overhead_tokens + rows x max width`; the
    partition of the rows sorted by width that minimises the total is found exactly by a
    dynamic programme over the distinct widths (at most ~20 per step, so it is cheap)."""
    if not widths:
        return []
    distinct = sorted(set(widths))
    counts = [widths.count(width) for width in distinct]
    # best[j]: cheapest cost of the first j distinct widths; cut[j]: where its last group starts.
    best = [0.0] + [float("inf")] * len(distinct)
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        rows = 0
        for i in range(j, 0, -1):
            rows += counts[i - 1]
            cost = best[i - 1] + overhead_tokens + rows * distinct[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups: list[list[int]] = []
    j = len(distinct)
    while j > 0:
        members = set(distinct[cut[j] : j])
        groups.append([row for row, width in enumerate(widths) if width in members])
        j = cut[j]
    return groups[::-1]


def check_request(prompt: list[int], params: SamplingParams, vocab_size: int, max_seq_len: int) -> None:
    """Refuse a request the engine cannot serve, naming the field."""
    if not prompt:
        raise ValueError("prompt_token_ids is empty")
    bad = [token for token in prompt if not 0 <= token < vocab_size]
    if bad:
        raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {vocab_size})")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if any(not text for text in params.stop):
        raise ValueError("stop: an empty stop text would end every completion at once")
    if len(prompt) + params.max_new_tokens > max_seq_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds "
            f"the engine's max_seq_len {max_seq_len}"
        )


def completed_stop_text(decode: Callable[[list[int]], str], token_ids: list[int], stop: Sequence[str]) -> str | None:
    """The `SamplingParams.stop` text the newest of `token_ids` completed, if any. Only the last
    tokens are decoded (a token is at least one character; a few decode to none, parts of one UTF-8
    character): a stop text found before would have ended the sequence then."""
    tail = decode(token_ids[-(max(len(text) for text in stop) + 4) :])
    return next((text for text in stop if text in tail), None)


def eos_token_ids(model: torch.nn.Module, tokenizer: Any | None) -> set[int]:
    """The model's end-of-sequence ids (generation config, config, tokenizer)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(token) for token in eos)
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
