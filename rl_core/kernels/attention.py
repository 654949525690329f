"""The attention kernel the engine and the trainer both run: sdpa under an explicit mask.

It lives here, beside `kernels/cpu.py` and `models/model_io.py`, because both sides of the rl_core
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
    per step); `enable_gqa` lets the kernel share them instead, where a fused kernel takes grouped
    heads with a mask (`fused_kernel_shares_kv_heads`); where none does, K/V are repeated, because
    sdpa would otherwise run its unfused math kernel (the whole score matrix in memory).
    Same math, so outputs match stock sdpa. Calls without a mask (plain causal: `model.generate`,
    an unmasked forward) go to stock sdpa."""
    if attention_mask is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    grouped = key.shape[1] != query.shape[1]
    if grouped and not fused_kernel_shares_kv_heads(query, key, value, attention_mask):
        key, value = repeat_kv_heads(key, query.shape[1]), repeat_kv_heads(value, query.shape[1])
        grouped = False
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=0.0, scale=scaling, enable_gqa=grouped
    )
    return output.transpose(1, 2).contiguous(), None


def repeat_kv_heads(states: torch.Tensor, query_heads: int) -> torch.Tensor:
    """[B, Hk, S, D] -> [B, query_heads, S, D], each K/V head repeated for its query group."""
    batch, kv_heads, length, dim = states.shape
    groups = query_heads // kv_heads
    return states[:, :, None].expand(batch, kv_heads, groups, length, dim).reshape(batch, query_heads, length, dim)


def fused_kernel_shares_kv_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether a fused sdpa kernel runs this masked call with grouped K/V heads as they are.

    On a CPU, yes: its flash kernel takes a mask and grouped heads (the engine's and the
    packed trainer's measured path). On CUDA, only if torch's own dispatch checks say the
    memory-efficient or the cuDNN kernel accepts it (flash takes no mask); as of torch 2.11
    neither takes grouped heads, and with `enable_gqa` the call would fall to the math kernel,
    which materialises every score (and, in bf16, upcasts them)."""
    if query.device.type == "cpu":
        return True
    if query.device.type != "cuda":
        return False
    params = torch.backends.cuda.SDPAParams(query, key, value, mask, 0.0, False, True)
    return bool(torch.backends.cuda.can_use_efficient_attention(params) or torch.backends.cuda.can_use_cudnn_attention(params))
