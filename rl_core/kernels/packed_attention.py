"""Attention over a packed training micro-batch at the cost of what each token may see.

A packed row (loss.py) holds prompt units: a trie of a group's tokens (token_trie.py), the
prompt once, then the completions sharing the tokens they begin with alike; each token
attends its ancestors and itself only. The dense 4-D mask says that exactly, but attention
under a mask still computes every (query, key) pair of the row: on the demo a 460-token row
spent ~6x the work the mask lets through, 30% of a training step (bench/RESULTS.md).
`PackedLayout` lists, for one micro-batch, the flat positions of every *branch* (a run of
tokens with one parent each: a prompt, a completion, or the part of several completions
after they diverge) and of its ancestors; `packed_attention` then runs one small attention
per layer, every branch over [its ancestors' keys ; its own keys] (causal on its own). The
outputs are the dense path's up to float summation order (tested, forward and gradients),
and nothing else changes: padding tokens, which no loss reads, get zeros instead of
attending to themselves.

Every trainer backend attends through it, the policy and the reference model alike
(`load_packed_attention_model`), whatever attention the model's `config.json` names: eager
attention adds the packed rows' boolean mask to its scores as 0/1 instead of masking (a wrong
loss and gradient), and a flash-attention kernel takes no such mask at all. A forward called
without a layout (the padding micro-batch, a reference forward with a plain mask) takes the
masked sdpa kernel (attention_kernels.py), exact for a boolean or additive mask. What cannot
be made exact is refused with an error naming the setting: a model class whose attention does
not go through transformers' AttentionInterface, a sliding window shorter than a row, logit
soft-capping, attention sinks. On a GPU the same layout is what a varlen flash-attention kernel
needs; this module uses torch's sdpa so that it runs anywhere.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import torch

from rl_core.kernels.attention import masked_gqa_sdpa

PACKED_ATTENTION = "inflight_packed"
# Keyword arguments an HF attention layer passes that change the math packed attention does
# (when set), and the config.json setting each comes from: refused, not silently ignored.
_INEXACT_SETTINGS = {"softcap": "attn_logit_softcapping", "s_aux": "sinks (attention sinks)"}

log = logging.getLogger(__name__)


class PackedAttentionUnsupported(ValueError):
    """A model the trainer cannot make attend exactly as a packed micro-batch requires."""


@dataclass
class PackedLayout:
    """One micro-batch's tokens as *branches* (token_trie.py): runs of flat positions (row *
    width + column) that each attend the keys of their ancestors, then causally their own. A
    group's prompt is the first branch of its unit, each completion (or each part of the
    completions after they diverge) a branch under it. Both lists are padded to the longest,
    with a valid position and a False in the `*_valid` mask."""

    branch_index: torch.Tensor  # [N, C] long: the branch's own positions
    branch_valid: torch.Tensor  # [N, C] bool
    context_index: torch.Tensor  # [N, A] long: the positions of its ancestors, root first
    context_valid: torch.Tensor  # [N, A] bool
    # What each query may attend, the same in every layer (so built once, here):
    mask: torch.Tensor  # [N, 1, C, A + C] bool: its real ancestors, then causal on its own

    @classmethod
    def from_branches(cls, branches: Sequence[tuple[Sequence[int], Sequence[int]]]) -> PackedLayout:
        """`branches`: (own positions, ancestor positions) of every branch of the micro-batch."""
        branch_index, branch_valid = _padded([list(own) for own, _ in branches], [own[0] for own, _ in branches])
        context_index, context_valid = _padded([list(context) for _, context in branches], [own[0] for own, _ in branches])
        own_length = branch_index.shape[1]
        # A padded query still sees its branch's first token, so no row of the mask is empty.
        sees_context = context_valid.unsqueeze(1).expand(-1, own_length, -1)
        sees_own = _causal(own_length) & branch_valid.unsqueeze(1)
        mask = torch.cat([sees_context, sees_own], dim=2).unsqueeze(1)
        return cls(branch_index, branch_valid, context_index, context_valid, mask)

    def to(self, device: torch.device | str) -> PackedLayout:
        return PackedLayout(*(getattr(self, field.name).to(device) for field in fields(self)))


def _padded(groups: list[list[int]], fills: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(group) for group in groups)
    index = torch.tensor([group + [fill] * (longest - len(group)) for group, fill in zip(groups, fills)], dtype=torch.long)
    valid = torch.tensor([[True] * len(group) + [False] * (longest - len(group)) for group in groups], dtype=torch.bool)
    return index.view(len(groups), longest), valid.view(len(groups), longest)


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
    _refuse_inexact(query.shape[2], kwargs)
    if packed_layout is None:
        return masked_gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    layout = packed_layout
    rows, query_heads, width, head_dim = query.shape
    key_heads = key.shape[1]
    flat_q = query.transpose(1, 2).reshape(rows * width, query_heads, head_dim)
    flat_k = key.transpose(1, 2).reshape(rows * width, key_heads, head_dim)
    flat_v = value.transpose(1, 2).reshape(rows * width, key_heads, head_dim)

    def gather(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # -> [N, H, L, D]
        return flat[index].transpose(1, 2)

    # Every branch: [its ancestors' keys ; its own keys], causal on its own.
    keys = torch.cat([gather(flat_k, layout.context_index), gather(flat_k, layout.branch_index)], dim=2)
    values = torch.cat([gather(flat_v, layout.context_index), gather(flat_v, layout.branch_index)], dim=2)
    branch_out = torch.nn.functional.scaled_dot_product_attention(
        gather(flat_q, layout.branch_index), keys, values, attn_mask=layout.mask, scale=scaling,
        enable_gqa=key_heads != query_heads)
    # Back to the packed positions; padding tokens (in no branch) keep zeros.
    out = query.new_zeros(rows * width, query_heads, head_dim)
    out = out.index_put((layout.branch_index[layout.branch_valid],), branch_out.transpose(1, 2)[layout.branch_valid])
    return out.view(rows, width, query_heads, head_dim), None


def _refuse_inexact(width: int, kwargs: dict[str, Any]) -> None:
    """Packed attention computes plain softmax attention over what the layout (or mask) allows;
    an attention layer asking for more would get a different result, so it is refused."""
    window = kwargs.get("sliding_window")
    # A query at depth p sees keys at depths 0..p <= width - 1: a window of at least the row's
    # width hides nothing, so only a shorter one changes the result.
    if window is not None and int(window) < width:
        raise PackedAttentionUnsupported(
            f"config.json sliding_window={window} (use_sliding_window / layer_types): a packed row of {width} tokens "
            "is longer than the window, and packed attention has no sliding window; lower trainer.micro_batch_tokens "
            "/ trainer.row_tokens below the window or train a model without one")
    for name, setting in _INEXACT_SETTINGS.items():
        if kwargs.get(name) is not None:
            raise PackedAttentionUnsupported(
                f"config.json {setting}: packed attention computes plain softmax attention and cannot apply it; "
                "the trainer would compute a different loss than the model defines")


def register_packed_attention() -> None:
    """Make `PACKED_ATTENTION` a name transformers' attention interface knows."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)


def use_packed_attention(model: torch.nn.Module, source: str | Path = "the model") -> None:
    """Make `model` (an HF model with the attention interface) and every sub-model attend through
    `packed_attention`; refuse (PackedAttentionUnsupported, naming `source`, its model.path) a
    model whose attention cannot be replaced: transformers only warns and keeps its own."""
    from transformers import PreTrainedModel

    register_packed_attention()
    if not type(model)._can_set_attn_implementation():
        raise PackedAttentionUnsupported(
            f"model.path {source}: {type(model).__name__}'s attention does not go through transformers' "
            "AttentionInterface, so the trainer cannot make it attend by the packed layout (its own attention "
            "would read the packed rows' mask in its own way, not exactly); use a model class that does")
    model.set_attn_implementation(PACKED_ATTENTION)
    stuck = sorted({f"{type(module).__name__}: {module.config._attn_implementation}" for module in model.modules()
                    if isinstance(module, PreTrainedModel) and module.config._attn_implementation != PACKED_ATTENTION})
    if stuck:
        raise PackedAttentionUnsupported(
            f"model.path {source}: attention could not be switched to packed attention in {', '.join(stuck)}")


def load_packed_attention_model(model_path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """The HF causal LM at `model_path`, attending through `packed_attention` from the start, whatever
    attention its config.json names (a flash-attention model then loads without the flash package
    too); a switch from what config.json asks for is logged. Every trainer backend loads its policy
    and its reference model here, so every backend computes the gradient the packing promises."""
    from transformers import AutoModelForCausalLM

    register_packed_attention()  # from_pretrained checks the name it is given
    model_path = Path(model_path)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype, attn_implementation=PACKED_ATTENTION)
    use_packed_attention(model, model_path)
    asked = json.loads((model_path / "config.json").read_text()).get("attn_implementation")
    if asked not in (None, "sdpa", PACKED_ATTENTION):
        log.warning("model.path %s: config.json asks for attn_implementation=%r; the trainer attends through %r "
                    "instead (exact for its packed micro-batches, which %r is not)", model_path, asked,
                    PACKED_ATTENTION, asked)
    return model
