"""Decoding sequences whose histories are identical once per step.

The n samples of a request, or a group's attempts at one problem, start from one prompt and often
draw the same first tokens: on the demo, the 8 rollouts of a group repeat 72% of their decode
positions (the same prompt and the same tokens so far as another member; counted over a 40-step
demo's stream). Two sequences admitted in the same engine step with the same prompt and the same
tokens hold the same K/V: every position was computed from the same tokens, in the same steps, so
on the same weights (an in-flight update reaches both at once). Their next-token logits are
therefore the same, and the engine computes them once:

1. `representatives` names, for every decoding sequence, the first one with its history;
2. the forward runs over the representatives only;
3. `SlotKVCache.copy_positions` copies each representative's new K/V position into the slots of
   the sequences it stood for, so every cache holds what its own forward would have written;
4. each sequence samples its own token from its representative's logits, with its own uniform
   (engine_sampling.PositionUniforms), temperature and top-p.

Tokens, logprobs and caches are what decoding each sequence alone gives, up to the float rounding
a different batch already brings (tested against the engine with sharing off). Sequences diverge
by themselves: a different sampled token makes a different history at the next step. Steps that
verify speculative drafts, and prefills, do not share. On a GPU the same grouping cuts decode rows
the same way; it is the reference engine's (vLLM shares prompt K/V blocks, not decode steps).
"""

from __future__ import annotations

from typing import Protocol, Sequence


class _HasHistory(Protocol):
    prompt_token_ids: list[int]
    token_ids: list[int]
    admitted_step: int
    cache_len: int
    history_hash: int


def prompt_history_hash(prompt_token_ids: Sequence[int]) -> int:
    """The history hash of a sequence that has generated nothing yet."""
    return hash(tuple(prompt_token_ids))


def extended_history_hash(history_hash: int, token: int) -> int:
    """The history hash after one more token (kept per sequence, so grouping is not O(length))."""
    return hash((history_hash, token))


def representatives(seqs: Sequence[_HasHistory]) -> list[int]:
    """For each sequence, the index in `seqs` of the first one with the same admission step,
    cache length, prompt and generated tokens (its own index when it is the first). The hash only
    narrows the search: histories are compared in full before two sequences are grouped."""
    firsts: dict[tuple[int, int, int, int], list[int]] = {}
    result: list[int] = []
    for index, seq in enumerate(seqs):
        key = (seq.admitted_step, seq.cache_len, len(seq.token_ids), seq.history_hash)
        candidates = firsts.setdefault(key, [])
        for candidate in candidates:
            other = seqs[candidate]
            if other.token_ids == seq.token_ids and other.prompt_token_ids == seq.prompt_token_ids:
                result.append(candidate)
                break
        else:
            candidates.append(index)
            result.append(index)
    return result
