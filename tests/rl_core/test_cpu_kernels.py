"""CPU linear layers on oneDNN: same numbers as torch's stock path, forward and backward, and the
engine and the trainer really run on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.kernels.cpu import ENV_SWITCH, use_onednn_linear
from rl_core.inference.engine import ReferenceEngine
from rl_core.trainer.torch_backend import TorchBackend


def _load(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits = model(input_ids=ids).logits
    logits.log_softmax(-1).mean().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_onednn_linear_gives_torchs_logits_and_gradients(untrained_tiny_model: Path) -> None:
    stock, fast = _load(untrained_tiny_model), _load(untrained_tiny_model)
    assert use_onednn_linear(fast) == sum(isinstance(m, torch.nn.Linear) for m in fast.modules()) > 0
    ids = torch.randint(3, 500, (3, 40), generator=torch.Generator().manual_seed(0))

    stock_logits, stock_grads = _loss_and_grads(stock, ids)
    fast_logits, fast_grads = _loss_and_grads(fast, ids)

    torch.testing.assert_close(fast_logits, stock_logits, rtol=1e-4, atol=1e-4)
    assert fast_grads.keys() == stock_grads.keys()  # every parameter, bias included, gets its gradient
    for name, grad in stock_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-3, atol=1e-6, msg=name)


def test_an_in_place_weight_update_reaches_the_onednn_path(untrained_tiny_model: Path) -> None:
    # In-flight updates copy new weights into the existing tensors: no cached copy may survive.
    model = _load(untrained_tiny_model).eval()
    use_onednn_linear(model)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(0.5)
        after = model(input_ids=ids).logits
        reference = _load(untrained_tiny_model).eval()
        for module in reference.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(0.5)
        torch.testing.assert_close(after, reference(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(before, after)


def test_the_switch_keeps_torchs_own_path(untrained_tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SWITCH, "torch")
    model = _load(untrained_tiny_model)
    assert use_onednn_linear(model) == 0
    assert all("forward" not in vars(m) for m in model.modules())


def test_engine_and_trainer_run_their_linears_on_onednn(untrained_tiny_model: Path) -> None:
    engine = ReferenceEngine.from_pretrained(untrained_tiny_model)
    backend = TorchBackend(untrained_tiny_model)
    for model in (engine.model, backend.model):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all("forward" in vars(m) for m in linears)
