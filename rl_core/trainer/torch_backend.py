"""Plain-torch `TrainerBackend`: one HF causal LM, AdamW, warm-up + constant/cosine LR.

Checkpoints are HF directories (`model.safetensors` + config + tokenizer files), so a
checkpoint can be served by `python -m rl_core serve --model` as is, plus
`optimizer.pt` (optimizer + LR schedule state + version) for exact resumption.

A model in bfloat16 or float16 trains against float32 master weights (`MasterWeights`): the
optimizer updates float32 copies, gradients accumulate into float32, and the model's weights
are the masters rounded after every step. Adam's steps at a typical RL learning rate (1e-6)
are ~1e-6 per weight, two orders below a bfloat16 weight's rounding step (~1e-4 at 0.02):
applied to the bfloat16 weights directly they round away, step after step, and the model
does not train at all.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import torch

from rl_core.kernels.cpu import use_onednn_linear
from rl_core.trainer.loss import model_token_logprobs, reference_token_logprobs
from rl_core.models.model_io import copy_side_files, model_dtype, use_tf32_matmul
from rl_core.kernels.packed_attention import PackedLayout, load_packed_attention_model

if TYPE_CHECKING:
    from rl_core.config.run_config import RunConfig



def lr_multiplier(step: int, warmup_steps: int, schedule: str, total_steps: int) -> float:
    """LR factor for the optimizer step about to be taken (0-based `step`): linear
    warm-up from 1/(warmup+1) to 1, then constant or cosine decay to 0 at `total_steps`."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"trainer.schedule: unknown schedule {schedule!r}")


class MasterWeights:
    """float32 masters of a low-precision model's trainable parameters: each parameter's
    gradient is added into its master's float32 gradient as soon as backward produces it (a
    post-accumulate hook; the low-precision gradient is freed at once), the optimizer steps the
    masters, and `publish` rounds them back into the model."""

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        self.parameters = parameters
        self.masters = [parameter.detach().float().clone() for parameter in parameters]
        for parameter, master in zip(parameters, self.masters):
            parameter.register_post_accumulate_grad_hook(self._accumulator(master))

    @staticmethod
    def _accumulator(master: torch.Tensor):
        def accumulate(parameter: torch.Tensor) -> None:
            if master.grad is None:
                master.grad = parameter.grad.float()
            else:
                master.grad.add_(parameter.grad)
            parameter.grad = None

        return accumulate

    @torch.no_grad()
    def publish(self) -> None:
        for parameter, master in zip(self.parameters, self.masters):
            parameter.copy_(master)

    @torch.no_grad()
    def load(self, masters: list[torch.Tensor]) -> None:
        if len(masters) != len(self.masters):
            raise ValueError(f"{len(masters)} master weights in the checkpoint, the model has {len(self.masters)}")
        for master, saved in zip(self.masters, masters):
            master.copy_(saved)
        self.publish()


class TorchBackend:
    def __init__(
        self,
        model_path: str | Path,
        device: str = "cpu",
        dtype: str = "float32",
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        schedule: str = "constant",
        total_steps: int = 1,
        grad_clip: float = 1.0,
        reference_model: bool = False,
    ) -> None:
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise FileNotFoundError(f"model.path: {self.model_path} is not an HF model directory (no config.json)")
        self.device = torch.device(device)
        use_tf32_matmul(self.device)
        # Attention only where a packed row's mask allows, whatever config.json names (packed_attention.py).
        self.model = load_packed_attention_model(self.model_path, model_dtype(dtype)).to(self.device)
        self.model.train()
        self.model.config.use_cache = False
        use_onednn_linear(self.model)  # CPU only: ~2x faster GEMMs, forward and backward (cpu_kernels.py)
        # Frozen copy for the k3 KL penalty; only loaded when the penalty is on.
        self.reference = None
        if reference_model:
            self.reference = load_packed_attention_model(self.model_path, model_dtype(dtype)).to(self.device)
            self.reference.eval().requires_grad_(False)
            use_onednn_linear(self.reference)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # float32 models step their own weights; lower precisions step float32 masters.
        self.master_weights = MasterWeights(trainable) if model_dtype(dtype) != torch.float32 else None
        self.optimizer = torch.optim.AdamW(
            self.master_weights.masters if self.master_weights else trainable, lr=lr, weight_decay=weight_decay
        )
        self.base_lr = lr
        self.warmup_steps = warmup_steps
        self.schedule = schedule
        self.total_steps = total_steps
        self.grad_clip = grad_clip
        self.version = 0
        self._set_lr()

    @classmethod
    def from_config(cls, config: RunConfig, model_path: str | Path) -> TorchBackend:
        """The backend of a run (`trainer.make_backend`); every backend is built from these two."""
        t = config.trainer
        return cls(
            model_path, device=t.device, dtype=config.model.dtype, lr=t.lr, weight_decay=t.weight_decay,
            warmup_steps=t.warmup_steps, schedule=t.schedule, total_steps=t.max_steps, grad_clip=t.grad_clip,
            reference_model=t.kl_coef > 0,
        )

    def _set_lr(self) -> float:
        lr = self.base_lr * lr_multiplier(self.version, self.warmup_steps, self.schedule, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # --- forward / backward / step -----------------------------------------------

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        temperature: float = 1.0, logit_source: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log p(token | context) and entropies: [B, T] aligned with input_ids, or a packed batch's
        [B, K] terms (see loss.model_token_logprobs)."""
        return model_token_logprobs(
            self.model, input_ids, attention_mask, position_ids, self.device, temperature, logit_source, packed_layout,
            target_ids,
        )

    @torch.no_grad()
    def reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        temperature: float = 1.0, logit_source: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return reference_token_logprobs(
            self.reference, input_ids, attention_mask, position_ids, self.device, temperature, logit_source, packed_layout,
            target_ids,
        )

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def optimizer_step(self) -> dict[str, float]:
        lr = self._set_lr()
        params = self.master_weights.masters if self.master_weights else [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master_weights:
            self.master_weights.publish()
        self.version += 1
        return {"grad_norm": float(grad_norm), "lr": lr}

    # --- weights out -------------------------------------------------------------

    def parameters_for_broadcast(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF parameter names in `named_parameters` order (tied weights appear once,
        under their first name — the receiver's model ties them the same way)."""
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    # --- checkpoints -------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> None:
        directory_path = Path(directory)
        directory_path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory_path), safe_serialization=True)
        copy_side_files(self.model_path, directory_path)
        extra = {"optimizer": self.optimizer.state_dict(), "version": self.version}
        if self.master_weights:  # the rounded model alone would lose what the masters hold below its precision
            extra["master_weights"] = [master.cpu() for master in self.master_weights.masters]
        torch.save(extra, directory_path / "optimizer.pt")

    def load_checkpoint(self, directory: str) -> None:
        """Weights, optimizer state and version from a directory `save_checkpoint` wrote."""
        from safetensors.torch import load_file

        directory_path = Path(directory)
        weights = directory_path / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"checkpoint {directory_path}: model.safetensors missing")
        state = load_file(str(weights), device=str(self.device))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied weights are saved once; anything else missing means a different model.
        tied = set(getattr(self.model, "_tied_weights_keys", None) or [])
        really_missing = [key for key in missing if key not in tied and "lm_head" not in key]
        if really_missing or unexpected:
            raise ValueError(f"checkpoint {directory_path} does not match the model: missing {really_missing[:5]}, unexpected {unexpected[:5]}")
        if "lm_head.weight" in missing and getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        extra = torch.load(directory_path / "optimizer.pt", map_location=self.device, weights_only=False)
        if self.master_weights:
            if "master_weights" in extra:
                self.master_weights.load(extra["master_weights"])
            else:  # a checkpoint written in float32: its weights are the masters
                self.master_weights.load([parameter.detach().float() for parameter in self.master_weights.parameters])
        self.optimizer.load_state_dict(extra["optimizer"])
        self.version = int(extra["version"])
        self._set_lr()
