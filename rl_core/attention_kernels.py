"""The attention kernel the engine and the trainer both run: sdpa under an explicit mask.

It lives here, beside `cpu_kernels.py` and `model_io.py`, because both sides of the rl_core
boundary use it: the engine registers it as its attention (`kv_cache.register_engine_attention`,
the slot cache's 4-D mask) and the trainer's `packed_attention` falls back to it for a forward
without a packed layout (the padding micro-batch, a plain mask). Neither side imports the
other's modules for it, so inference and training keep meeting only through weights.
"""

from __future__ import annotations

from typing import Any

import torch


def masked_gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa with an explicit mask and grouped KV heads passed as they are (an HF attention-interface
    function: `query` [B, Hq, T, D], `key`/`value` [B, Hk, S, D] -> [B, T, Hq, D]).

    The mask is boolean ("may attend") or additive (0 / the dtype's minimum); sdpa reads both
    correctly, unlike eager attention, which adds a boolean mask as 0/1. The stock HF sdpa path
    repeats K/V for every query head whenever a mask is given (a copy of the whole cache per layer
    per step); `enable_gqa` lets the kernel share them instead. Same math, so outputs match stock
    sdpa. Calls without a mask (plain causal: `model.generate`, an unmasked forward) go to stock sdpa."""
    if attention_mask is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=0.0, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )
    return output.transpose(1, 2).contiguous(), None
