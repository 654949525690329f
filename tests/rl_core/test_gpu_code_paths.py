"""What a GPU changes in the code, tested where a CPU can test it: float32 master weights of a
bfloat16 torch trainer, masked grouped-query attention without the unfused kernel, TF32 only
on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_core.kernels import attention as attention_kernels
from rl_core.kernels.attention import masked_gqa_sdpa, repeat_kv_heads
from rl_core.models.model_io import use_tf32_matmul
from rl_core.trainer.loop import make_backend, train_step
from tests.rl_core.test_trainer import make_config, make_samples


def _changed_share(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    changed = sum(int(torch.count_nonzero(a != b)) for a, b in zip(before, after))
    return changed / sum(a.numel() for a in before)


def test_a_bfloat16_trainer_accumulates_updates_far_below_a_bfloat16_step(untrained_tiny_model: Path) -> None:
    """30 steps at lr 1e-6 move each weight ~3e-5, under half a bfloat16 rounding step for most
    weights (~6e-5 at 0.02). Applied to bfloat16 weights directly every step rounds away: before
    the float32 masters, 1.9% of the attention and MLP weights ever changed. With masters the
    bfloat16 weights are the masters rounded, so most of them move."""
    config = make_config(untrained_tiny_model, lr=1e-6, max_steps=30)
    config = config.model_copy(update={"model": config.model.model_copy(update={"dtype": "bfloat16"})})
    backend = make_backend(config, untrained_tiny_model)
    weights = [p for name, p in backend.model.named_parameters() if "layers." in name and p.dim() == 2]
    assert weights and all(p.dtype == torch.bfloat16 for p in weights)
    before = [p.detach().clone() for p in weights]
    samples = make_samples(4, 7)
    for _ in range(30):
        _, info = train_step(backend, samples, config)
        assert info["grad_norm"] > 0
    assert _changed_share(before, [p.detach() for p in weights]) > 0.25
    masters = backend.master_weights.masters
    assert all(m.dtype == torch.float32 for m in masters)
    # The model holds the masters rounded, nothing else.
    for parameter, master in zip(backend.master_weights.parameters, masters):
        assert torch.equal(parameter.detach(), master.to(torch.bfloat16))


def test_bfloat16_masters_survive_a_checkpoint(untrained_tiny_model: Path, tmp_path: Path) -> None:
    config = make_config(untrained_tiny_model, lr=1e-6)
    config = config.model_copy(update={"model": config.model.model_copy(update={"dtype": "bfloat16"})})
    backend = make_backend(config, untrained_tiny_model)
    train_step(backend, make_samples(4, 3), config)
    backend.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = make_backend(config, untrained_tiny_model)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    for saved, loaded in zip(backend.master_weights.masters, resumed.master_weights.masters):
        assert torch.equal(saved, loaded)  # not the bfloat16 rounding of them
    assert resumed.version == 1


def test_a_float32_trainer_keeps_no_masters(untrained_tiny_model: Path) -> None:
    backend = make_backend(make_config(untrained_tiny_model), untrained_tiny_model)
    assert backend.master_weights is None


@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_repeated_kv_heads_compute_what_grouped_heads_do(mask_kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path without a fused grouped kernel repeats K/V; the CPU's shares them. Same result."""
    torch.manual_seed(0)
    query, key, value = torch.randn(2, 6, 5, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    allowed = torch.rand(2, 1, 5, 9) > 0.3
    allowed[..., 0] = True
    mask = allowed if mask_kind == "bool" else torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    shared, _ = masked_gqa_sdpa(None, query, key, value, mask, scaling=0.25)
    monkeypatch.setattr(attention_kernels, "fused_kernel_shares_kv_heads", lambda *args: False)
    repeated, _ = masked_gqa_sdpa(None, query, key, value, mask, scaling=0.25)
    assert torch.allclose(shared, repeated, atol=1e-6)
    assert torch.equal(repeat_kv_heads(key, 6)[:, 2:6:3], key[:, [0, 1]].repeat(1, 1, 1, 1)[:, [0, 1]])


def test_the_cpu_shares_kv_heads_and_cuda_asks_torch_dispatch() -> None:
    query, key = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 5, 64)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    assert attention_kernels.fused_kernel_shares_kv_heads(query, key, key, mask)
    # On CUDA the answer is torch's own dispatch check, which refuses CPU tensors: the same
    # call shape must be accepted by SDPAParams (it was a 7-argument constructor in 2.11).
    params = torch.backends.cuda.SDPAParams(query, key, key, mask, 0.0, False, True)
    assert torch.backends.cuda.can_use_efficient_attention(params) is False


def test_tf32_is_left_alone_off_cuda() -> None:
    before = torch.get_float32_matmul_precision()
    assert use_tf32_matmul("cpu") is False
    assert torch.get_float32_matmul_precision() == before
