"""Linear layers on oneDNN when a model runs on the CPU.

torch's CPU `nn.Linear` calls MKL's sgemm. On AMD CPUs MKL takes its generic AVX2 path even where
the CPU has AVX-512, while oneDNN (also inside every torch wheel) picks the CPU's widest kernels:
on this project's Zen CPUs the same fp32 GEMMs run ~2x faster through oneDNN, for the shapes of
both decoding (256 x 256 x 1024) and training (2,000+ rows), one thread each (bench/cpu_kernels.py).
vLLM's CPU backend uses oneDNN for its linear layers for the same reason.

`use_onednn_linear(model)` makes every `nn.Linear` of a model compute through oneDNN, forward and
backward, in the same dtype: results differ from MKL's only by float summation order (fp32:
~1e-5 on the demo model's logits, tested). Parameters, state dicts and in-place weight updates are
untouched: oneDNN reads the dense weight tensors on every call, so in-flight weight updates and
checkpoint loads keep working. INFLIGHT_CPU_LINEAR=torch turns it off (the stock path).
The reference engine and TorchBackend use it; the DeepSpeed backend keeps torch's path (ZeRO
gathers and partitions weights in its own module hooks, which this has not been checked under).
"""

from __future__ import annotations

import os
from typing import Any

import torch

ENV_SWITCH = "INFLIGHT_CPU_LINEAR"
_DTYPES = (torch.float32, torch.bfloat16)


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight.T + bias for 2-D x, on oneDNN (dense tensors in, dense tensor out)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_linear_nd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`_onednn_linear` over the last dimension of an [..., in] tensor."""
    return _onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])


class _OneDnnLinear(torch.autograd.Function):
    """y = x W^T + b with both backward GEMMs on oneDNN as well (the trainer spends 2/3 of a step
    in backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear_nd(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # dL/dx = dL/dy @ W (oneDNN reads W^T as a strided view: no copy)
            grad_x = _onednn_linear(grad_rows, weight.t(), None).reshape(x.shape)
        if ctx.needs_input_grad[1]:  # dL/dW = dL/dy^T @ x (transposed views: oneDNN reorders them itself,
            # ~10% faster than copying them first at the demo's ~600-1,500 rows, bit-identical results)
            rows = x.reshape(-1, x.shape[-1])
            grad_weight = _onednn_linear(grad_rows.t(), rows.t(), None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return grad_x, grad_weight, grad_bias


def _linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
        return _OneDnnLinear.apply(x, self.weight, self.bias)
    # Decoding (no autograd): straight to the kernel, no graph bookkeeping per call.
    return _onednn_linear_nd(x, self.weight, self.bias)


def onednn_linear_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where the oneDNN path applies: a CPU model in fp32/bf16, a torch built with oneDNN,
    and not switched off by INFLIGHT_CPU_LINEAR=torch."""
    if os.environ.get(ENV_SWITCH, "onednn").strip().lower() == "torch":
        return False
    return (device.type == "cpu" and dtype in _DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            # oneDNN has no bf16 inner product without AVX512-BF16/AMX: it raises, not falls back
            and (dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def use_onednn_linear(model: torch.nn.Module) -> int:
    """Route every nn.Linear of a CPU model through oneDNN; returns how many layers now do.
    A no-op (0) on GPU, in other dtypes, or with INFLIGHT_CPU_LINEAR=torch."""
    first = next(model.parameters(), None)
    if first is None or not onednn_linear_available(first.device, first.dtype):
        return 0
    layers = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    for layer in layers:
        # An instance attribute: nn.Module.__call__ finds it before the class's forward; the
        # layer's parameters and state dict stay exactly as they were.
        layer.forward = _linear_forward.__get__(layer)  # type: ignore[method-assign]
    return len(layers)
