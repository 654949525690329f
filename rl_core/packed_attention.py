"""Attention over a packed training micro-batch at the cost of what each token may see.

A packed row (loss.py) holds prompt units: one copy of a group's prompt followed by its
completions, each completion attending the prompt and itself only. The dense 4-D mask says
that exactly, but attention under a mask still computes every (query, key) pair of the row:
on the demo a 460-token row spends ~6x the work the mask lets through, 30% of a training
step (bench/RESULTS.md). `PackedLayout` lists, for one micro-batch, the flat positions of
every prompt and every completion; `packed_attention` then runs two small attentions per
layer: the prompts causally among themselves, and every completion over [its prompt's
keys ; its own keys] (causal on its own). The outputs are the dense path's up to float
summation order (tested, forward and gradients), and nothing else changes: padding tokens,
which no loss reads, get zeros instead of attending to themselves.

`use_packed_attention(model)` registers the function as the model's attention; a forward
called without a layout (the padding micro-batch, a reference forward with a plain mask)
takes the masked sdpa path as before. On a GPU the same layout is what a varlen
flash-attention kernel needs; this module uses torch's sdpa so that it runs anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

import torch

PACKED_ATTENTION = "inflight_packed"


@dataclass
class PackedLayout:
    """Flat token positions (row * width + column) of one micro-batch's prompts and completions,
    each padded to the longest with a valid position and a False in its `*_valid` mask."""

    prompt_index: torch.Tensor  # [U, P] long
    prompt_valid: torch.Tensor  # [U, P] bool
    completion_index: torch.Tensor  # [S, C] long
    completion_valid: torch.Tensor  # [S, C] bool
    completion_unit: torch.Tensor  # [S] long: the unit (row of prompt_index) each completion belongs to
    # What each query may attend, the same in every layer (so built once, here):
    prompt_mask: torch.Tensor  # [U, 1, P, P] bool: causal among the prompt's real tokens
    completion_mask: torch.Tensor  # [S, 1, C, P + C] bool: its prompt's real tokens, then causal on its own

    @classmethod
    def from_token_owners(cls, units: Sequence[Sequence[int]], sequences: Sequence[Sequence[int]], width: int) -> PackedLayout:
        """`units[r][t]` is the unit (within row r) of token t, `sequences[r][t]` its completion
        within that unit or -1 for a prompt token (the lists loss._stack_rows builds, unpadded)."""
        prompts: dict[tuple[int, int], list[int]] = {}
        completions: dict[tuple[int, int, int], list[int]] = {}
        for row, (row_units, row_sequences) in enumerate(zip(units, sequences)):
            for column, (unit, sequence) in enumerate(zip(row_units, row_sequences)):
                flat = row * width + column
                if sequence < 0:
                    prompts.setdefault((row, unit), []).append(flat)
                else:
                    completions.setdefault((row, unit, sequence), []).append(flat)
        unit_number = {key: number for number, key in enumerate(prompts)}
        prompt_index, prompt_valid = _padded(list(prompts.values()))
        completion_index, completion_valid = _padded(list(completions.values()))
        completion_unit = torch.tensor([unit_number[(row, unit)] for row, unit, _ in completions], dtype=torch.long)
        # A padded query still sees its unit's first token, so no row of either mask is empty.
        prompt_len, completion_len = prompt_index.shape[1], completion_index.shape[1]
        prompt_mask = (_causal(prompt_len) & prompt_valid.unsqueeze(1)).unsqueeze(1)
        sees_prompt = prompt_valid[completion_unit].unsqueeze(1).expand(-1, completion_len, -1)
        sees_own = _causal(completion_len) & completion_valid.unsqueeze(1)
        completion_mask = torch.cat([sees_prompt, sees_own], dim=2).unsqueeze(1)
        return cls(prompt_index, prompt_valid, completion_index, completion_valid, completion_unit, prompt_mask, completion_mask)

    def to(self, device: torch.device | str) -> PackedLayout:
        return PackedLayout(*(getattr(self, field.name).to(device) for field in fields(self)))


def _padded(groups: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(group) for group in groups)
    index = torch.tensor([group + [group[0]] * (longest - len(group)) for group in groups], dtype=torch.long)
    valid = torch.tensor([[True] * len(group) + [False] * (longest - len(group)) for group in groups])
    return index, valid


def _causal(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_layout: PackedLayout | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface function: `query` [R, Hq, T, D], `key`/`value` [R, Hk, T, D];
    returns [R, T, Hq, D]. Without a layout: masked sdpa, K/V heads shared (no copies)."""
    if packed_layout is None:
        from rl_core.kv_cache import masked_gqa_sdpa

        return masked_gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    layout = packed_layout
    rows, query_heads, width, head_dim = query.shape
    key_heads = key.shape[1]
    gqa = key_heads != query_heads
    flat_q = query.transpose(1, 2).reshape(rows * width, query_heads, head_dim)
    flat_k = key.transpose(1, 2).reshape(rows * width, key_heads, head_dim)
    flat_v = value.transpose(1, 2).reshape(rows * width, key_heads, head_dim)

    def gather(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # -> [N, H, L, D]
        return flat[index].transpose(1, 2)

    # Prompts: causal among their own tokens.
    prompt_k, prompt_v = gather(flat_k, layout.prompt_index), gather(flat_v, layout.prompt_index)
    prompt_out = torch.nn.functional.scaled_dot_product_attention(
        gather(flat_q, layout.prompt_index), prompt_k, prompt_v, attn_mask=layout.prompt_mask, scale=scaling, enable_gqa=gqa)
    # Completions: [their prompt's keys ; their own keys], causal on their own.
    keys = torch.cat([prompt_k[layout.completion_unit], gather(flat_k, layout.completion_index)], dim=2)
    values = torch.cat([prompt_v[layout.completion_unit], gather(flat_v, layout.completion_index)], dim=2)
    completion_out = torch.nn.functional.scaled_dot_product_attention(
        gather(flat_q, layout.completion_index), keys, values, attn_mask=layout.completion_mask, scale=scaling, enable_gqa=gqa)
    # Back to the packed positions; padding tokens (in no unit) keep zeros.
    out = query.new_zeros(rows * width, query_heads, head_dim)
    out = out.index_put((layout.prompt_index[layout.prompt_valid],), prompt_out.transpose(1, 2)[layout.prompt_valid])
    out = out.index_put((layout.completion_index[layout.completion_valid],), completion_out.transpose(1, 2)[layout.completion_valid])
    return out.view(rows, width, query_heads, head_dim), None


def use_packed_attention(model: torch.nn.Module) -> None:
    """Make `model` (an HF model with the attention interface) attend through `packed_attention`."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    model.set_attn_implementation(PACKED_ATTENTION)
