"""Every trainer backend computes the loss and gradient of its packed micro-batches exactly as one
unpacked forward per sequence would, whatever attention the model's config.json names.

The packed side is the product's own `trainer.train_step` on a backend a run would build (a
group's prompt once, the completions a trie: shared prompts and shared completion prefixes, rows
stacked as a batch, several micro-batches, a k3 KL to the reference model, temperature 0.7). The
unpacked side is a stock transformers model, eager attention, one forward per sample with no mask
at all (plain causal attention, which every implementation computes right), scored by the same
`policy_loss`. Before packed attention was forced on every backend, a config.json naming eager
attention made the DeepSpeed backend add the packed rows' boolean mask to its scores as 0/1:
loss off by ~0.5%, gradients off by up to half their size. The DeepSpeed side runs in
tests/rl_core/test_deepspeed_backend.py (a child process on gloo), through the helpers here.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_core.common.contracts import RolloutSample

# What config.json says about attention in each model directory the tests build: nothing (loads
# as sdpa), sdpa, eager, a flash kernel (not installable on CPU: only loadable because the trainer
# replaces it) and packed attention itself.
CONFIGURED_ATTENTION = {"default": None, "sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2",
                        "packed": "inflight_packed"}
TEMPERATURE = 0.7
# float32 through different kernels and summation orders (sdpa per branch vs eager per sequence,
# oneDNN vs MKL GEMMs): measured at most 1.7e-7 relative on the loss, 2.3e-6 on the gradient norm
# and 8e-7 of the largest gradient entry, on both backends. The eager mask read as 0/1 scores was
# off by 1e-2 (loss), 0.45 (norm) and 1.03 (largest entry) on the same batch.
LOSS_RELATIVE_TOLERANCE = 1e-6
GRADIENT_TOLERANCE = 2e-5  # relative to the norm, and of the largest entry


def model_dir_with_attention(model: Path, kind: str, parent: Path) -> Path:
    """A copy of `model` whose config.json names attention `kind` (a CONFIGURED_ATTENTION key)."""
    target = parent / f"model-{kind}"
    if not target.exists():
        shutil.copytree(model, target)
        config = json.loads((target / "config.json").read_text())
        config.pop("attn_implementation", None)
        if CONFIGURED_ATTENTION[kind] is not None:
            config["attn_implementation"] = CONFIGURED_ATTENTION[kind]
        (target / "config.json").write_text(json.dumps(config))
    return target


def grouped_samples(seed: int = 5) -> list[RolloutSample]:
    """Groups of 1-5 samples per prompt whose completions often begin alike (shared prefixes of
    the trie), with behaviour logprobs that make the importance weights differ from 1."""
    rng = random.Random(seed)
    samples = []
    for group in range(5):
        prompt = [rng.randrange(10, 500) for _ in range(rng.randrange(3, 10))]
        start = [rng.randrange(10, 500) for _ in range(rng.randrange(2, 5))]
        for member in range(rng.choice([1, 3, 5])):
            shared = start[: rng.randrange(0, len(start) + 1)]
            completion = shared + [rng.randrange(10, 500) for _ in range(rng.randrange(1, 9))]
            samples.append(RolloutSample(
                sample_id=f"s{group}-{member}", group_id=f"g{group}", prompt_id=f"p{group}", prompt_token_ids=prompt,
                completion_token_ids=completion,
                behaviour_logprobs=[rng.uniform(-6.8, -5.6) for _ in completion],
                token_versions=[0] * len(completion), reward=float(member % 2), success=bool(member % 2),
                advantage=rng.choice([-1.0, -0.5, 0.5, 1.0]),
            ))
    return samples


def exactness_config(backend: str, zero_stage: int = 0, kind: str = "pipelinerl") -> Any:
    """Small micro-batches of short rows (several of each), prefixes shared, a KL term, T=0.7."""
    from rl_core.config.run_config import RunConfig

    return RunConfig.model_validate({
        "sampling": {"temperature": TEMPERATURE},
        "trainer": {"backend": backend, "zero_stage": zero_stage, "loss": kind, "kl_coef": 0.1, "grad_clip": 1e6,
                    "micro_batch_tokens": 96, "row_tokens": 48, "share_completion_prefixes": True, "warmup_steps": 0},
    })


def unpacked_loss_and_gradients(model_path: Path, samples: list[RolloutSample], config: Any) -> dict[str, Any]:
    """The step's loss and gradients from one unmasked forward per sample of a stock eager model."""
    from transformers import AutoModelForCausalLM

    from rl_core.trainer.loss import model_token_logprobs, pack_micro_batches
    from rl_core.trainer.losses import LossSettings, policy_loss

    settings = LossSettings.from_config(config)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, attn_implementation="eager")
    model.config.use_cache = False
    total = 0.0
    for sample in samples:
        (single,) = pack_micro_batches([sample], 10**6, share_prompts=False, share_prefixes=False)
        assert single.input_ids.shape[0] == 1  # one row, no padding: the whole sequence
        logprobs, entropy = model_token_logprobs(
            model, single.input_ids, None, None, "cpu", TEMPERATURE, single.logit_source, None, single.target_ids)
        out = policy_loss(logprobs, single, len(samples), settings, entropy=entropy, reference_logprobs=logprobs.detach())
        out.loss.backward()
        total += float(out.loss.detach())
    gradients = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    # The norm in float64: a float32 norm of the ~4M entries at once is off by ~1e-3.
    return {"loss": total, "gradient": torch.cat(gradients), "grad_norm": float(torch.cat(gradients).double().norm())}


def packed_loss_and_gradients(backend: Any, parameters: Any, samples: list[RolloutSample], config: Any) -> dict[str, Any]:
    """`trainer.train_step` on the backend, with the gradients of `parameters()` read just before
    the optimizer step (empty where ZeRO partitions them); `grad_norm` is the step's own."""
    from rl_core.trainer.loss import pack_micro_batches
    from rl_core.trainer.loop import train_step

    t = config.trainer
    batches = pack_micro_batches(samples, t.micro_batch_tokens, t.packed_row_tokens(), share_prefixes=True)
    # The layout really is packed: several micro-batches, stacked rows, prompts and prefixes shared.
    assert len(batches) >= 2 and any(batch.input_ids.shape[0] > 1 for batch in batches)
    packed_tokens = sum(int(batch.packed_layout.branch_valid.sum()) for batch in batches)
    assert packed_tokens < sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in samples) - 50
    captured: dict[str, Any] = {}
    real_step = backend.optimizer_step

    def capture_then_step() -> dict[str, float]:
        grads = [p.grad.detach().flatten().clone() for p in parameters() if p.grad is not None]
        captured["gradient"] = torch.cat(grads) if grads else None
        return real_step()

    backend.optimizer_step = capture_then_step
    stats, info = train_step(backend, samples, config)
    return {"loss": stats.loss, "gradient": captured["gradient"], "grad_norm": info["grad_norm"]}


def compare(packed: dict[str, Any], unpacked: dict[str, Any]) -> dict[str, float]:
    """Relative differences: loss, gradient norm, largest gradient entry (nan when not captured)."""
    out = {"loss": abs(packed["loss"] - unpacked["loss"]) / abs(unpacked["loss"]),
           "grad_norm": abs(packed["grad_norm"] - unpacked["grad_norm"]) / unpacked["grad_norm"],
           "gradient": float("nan")}
    if packed["gradient"] is not None:
        reference = unpacked["gradient"]
        out["gradient"] = float((packed["gradient"] - reference).abs().max() / reference.abs().max())
    return out


def assert_exact(differences: dict[str, float], with_gradient: bool = True) -> None:
    assert differences["loss"] < LOSS_RELATIVE_TOLERANCE, differences
    assert differences["grad_norm"] < GRADIENT_TOLERANCE, differences
    if with_gradient:
        assert differences["gradient"] < GRADIENT_TOLERANCE, differences


# --- the torch backend -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pipelinerl", "grpo_clip"])
@pytest.mark.parametrize("attention", list(CONFIGURED_ATTENTION))
def test_torch_backend_packed_equals_unpacked(
    untrained_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, attention: str, kind: str
) -> None:
    from rl_core.trainer.torch_backend import TorchBackend

    model = model_dir_with_attention(untrained_tiny_model, attention, tmp_path_factory.getbasetemp())
    samples = grouped_samples()
    config = exactness_config("torch", kind=kind)
    unpacked = unpacked_loss_and_gradients(untrained_tiny_model, samples, config)
    backend = TorchBackend.from_config(config, model)
    packed = packed_loss_and_gradients(backend, backend.model.parameters, samples, config)
    assert_exact(compare(packed, unpacked))


def test_the_trainer_says_when_it_replaces_the_configured_attention(
    untrained_tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    from rl_core.kernels.packed_attention import PACKED_ATTENTION
    from rl_core.trainer.torch_backend import TorchBackend

    model = model_dir_with_attention(untrained_tiny_model, "eager", tmp_path_factory.getbasetemp())
    with caplog.at_level(logging.WARNING, logger="rl_core.kernels.packed_attention"):
        backend = TorchBackend(model, reference_model=True)
    assert backend.model.config._attn_implementation == PACKED_ATTENTION
    assert backend.reference.config._attn_implementation == PACKED_ATTENTION
    switched = [record.getMessage() for record in caplog.records if "attn_implementation='eager'" in record.getMessage()]
    assert len(switched) == 2 and str(model) in switched[0] and PACKED_ATTENTION in switched[0], caplog.text


@pytest.mark.parametrize("backend", ["torch", "deepspeed"])
def test_every_backend_packs_a_micro_batch_as_one_row_by_default(backend: str) -> None:
    """Rows were kept at 512 tokens for DeepSpeed while it attended by the dense mask (cost: the
    square of a row); it attends by the layout now, so its rows are as long as TorchBackend's."""
    from rl_core.config.run_config import LAYOUT_ROW_TOKENS, RunConfig

    trainer = RunConfig.model_validate({"trainer": {"backend": backend, "micro_batch_tokens": 2048}}).trainer
    assert trainer.packed_row_tokens() == 2048
    assert trainer.model_copy(update={"micro_batch_tokens": 10**5}).packed_row_tokens() == LAYOUT_ROW_TOKENS


# --- what cannot be made exact is refused ------------------------------------------------


def test_a_model_whose_attention_cannot_be_replaced_is_refused(
    untrained_tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers only *warns* when a model class's attention does not go through its
    AttentionInterface, and the model keeps attending its own way: the trainer refuses instead."""
    from transformers import Qwen2ForCausalLM

    from rl_core.kernels.packed_attention import PackedAttentionUnsupported
    from rl_core.trainer.torch_backend import TorchBackend

    monkeypatch.setattr(Qwen2ForCausalLM, "_can_set_attn_implementation", classmethod(lambda cls: False))
    with pytest.raises(PackedAttentionUnsupported, match=r"model\.path .*Qwen2ForCausalLM.*AttentionInterface"):
        TorchBackend(untrained_tiny_model)


def test_a_sliding_window_shorter_than_a_row_is_refused(untrained_tiny_model: Path, tmp_path: Path) -> None:
    from rl_core.trainer.loss import pack_micro_batches
    from rl_core.kernels.packed_attention import PackedAttentionUnsupported
    from rl_core.trainer.torch_backend import TorchBackend

    model = tmp_path / "windowed"
    shutil.copytree(untrained_tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config.update(use_sliding_window=True, sliding_window=8, max_window_layers=0,
                  layer_types=["sliding_attention"] * config["num_hidden_layers"])
    (model / "config.json").write_text(json.dumps(config))
    backend = TorchBackend(model)
    batch = pack_micro_batches(grouped_samples(), 4096)[0]
    with pytest.raises(PackedAttentionUnsupported, match="sliding_window=8"):
        backend.token_logprobs(batch.input_ids, batch.attention_mask, batch.position_ids, TEMPERATURE,
                               batch.logit_source, batch.packed_layout, batch.target_ids)
    # Shorter than the window: nothing is hidden, so it is exact and allowed.
    backend.token_logprobs(torch.tensor([[5, 6, 7]]), None, None)


@pytest.mark.parametrize(("argument", "setting"), [("softcap", "attn_logit_softcapping"), ("s_aux", "sinks")])
def test_attention_math_packed_attention_does_not_do_is_refused(argument: str, setting: str) -> None:
    """Logit soft-capping (Gemma 2) and attention sinks (gpt-oss) change the softmax: an attention
    layer passing them would otherwise get plain attention without a word."""
    from rl_core.kernels.packed_attention import PackedAttentionUnsupported, packed_attention

    query = key = torch.zeros(1, 2, 3, 8)
    packed_attention(torch.nn.Module(), query, key, key, None, **{argument: None})  # unset: attends
    with pytest.raises(PackedAttentionUnsupported, match=setting):
        packed_attention(torch.nn.Module(), query, key, key, None, **{argument: torch.tensor(30.0)})
