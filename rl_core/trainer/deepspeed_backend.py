"""DeepSpeed ZeRO `TrainerBackend` (stages 0–3), a drop-in for `torch_backend.TorchBackend`.

The training loop (`trainer.train_step`) calls `token_logprobs` → `backward` once per
packed micro-batch and then `optimizer_step` once; the number of micro-batches changes
from step to step (they are packed by token budget). DeepSpeed's usual gradient
accumulation counts a fixed number of micro-batches, so the engine is configured with
`managed_gradient_accumulation: false`: every `backward` only accumulates, and
`step()` is the reduction + update boundary, whatever the count.

Weights leave through `parameters_for_broadcast()`: under ZeRO-3 each rank holds only a
shard of every parameter, so parameters are gathered a bucket at a time
(`deepspeed.zero.GatheredParameters`, a collective: every trainer rank must iterate the
generator) and yielded as full tensors in HF naming, in `named_parameters` order.

Checkpoints are HF model directories (`model.safetensors` + config + tokenizer files, so
`checkpoints/latest` can be served as is) plus `deepspeed/` with DeepSpeed's own
(possibly partitioned) optimizer state and the policy version.

Runs on CPU (DeepSpeed's CPU accelerator, gloo) as well as on CUDA (NCCL). The first
`deepspeed.init_distributed` on CPU JIT-compiles a shared-memory comm op (~70–80 s
cold); its build is cached under `TORCH_EXTENSIONS_DIR`, which defaults to
`~/.cache/inflight/torch_extensions` so every run and test reuses one build.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator

import torch

from rl_core.config.run_config import RunConfig
from rl_core.trainer.loss import model_token_logprobs, reference_token_logprobs
from rl_core.kernels.packed_attention import PackedLayout, load_packed_attention_model
from rl_core.common.processes import free_port
from rl_core.models.model_io import copy_side_files, model_dtype, use_tf32_matmul
from rl_core.trainer.torch_backend import lr_multiplier

TORCH_EXTENSIONS_DEFAULT = Path.home() / ".cache" / "inflight" / "torch_extensions"
# Parameters gathered together per ZeRO-3 all-gather while broadcasting: big enough to
# amortise the collective, small enough that one bucket of full tensors fits beside the shards.
DEFAULT_BROADCAST_BUCKET_BYTES = 256 * 2**20
DEEPSPEED_STATE_DIR = "deepspeed"
DEEPSPEED_TAG = "state"


def ensure_torch_extensions_dir() -> Path:
    """Point DeepSpeed's JIT op builds at one persistent cache unless the user chose one."""
    directory = Path(os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DEFAULT)))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _ensure_single_process_env() -> None:
    """A trainer started as one plain process (not by torchrun/deepspeed) is rank 0 of 1."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = "1"
    os.environ["LOCAL_RANK"] = "0"


def build_deepspeed_config(config: RunConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for a run (kept a plain dict so tests can read it)."""
    t = config.trainer
    zero: dict[str, Any] = {"stage": int(t.zero_stage)}
    if t.zero_stage == 3:
        # Every parameter is partitioned, small ones too: the broadcast path must gather
        # all of them, and a tiny test model then exercises exactly that path.
        zero["stage3_param_persistence_threshold"] = 0
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        # The loop decides how many micro-batches make a step (token-budget packing).
        "managed_gradient_accumulation": False,
        "zero_optimization": zero,
        # torch.optim.AdamW is what the torch backend uses; ZeRO shards its state.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    # Stage 0 has no ZeRO optimizer to report the norm, so the backend clips itself
    # (explicit 0.0: DeepSpeed's default is to clip at 1.0).
    ds["gradient_clipping"] = float(t.grad_clip) if t.zero_stage > 0 else 0.0
    if config.model.dtype == "bfloat16":
        ds["bf16"] = {"enabled": True}
    elif config.model.dtype == "float16":
        ds["fp16"] = {"enabled": True, "initial_scale_power": 16}
    return ds


class DeepSpeedBackend:
    """`contracts.TrainerBackend` on a DeepSpeed engine. Built by `trainer.make_backend`."""

    def __init__(
        self,
        config: RunConfig,
        model_path: str | Path,
        broadcast_bucket_bytes: int = DEFAULT_BROADCAST_BUCKET_BYTES,
    ) -> None:
        if broadcast_bucket_bytes <= 0:
            raise ValueError("broadcast_bucket_bytes must be positive")
        self.config = config
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise FileNotFoundError(f"model.path: {self.model_path} is not an HF model directory (no config.json)")
        t = config.trainer
        self.zero_stage = int(t.zero_stage)
        self.broadcast_bucket_bytes = int(broadcast_bucket_bytes)

        ensure_torch_extensions_dir()
        import deepspeed

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        self._deepspeed = deepspeed
        device = torch.device(t.device)
        use_tf32_matmul(device)  # float32 work DeepSpeed keeps (masters, a float32 run) on the tensor cores
        if device.type == "cuda":
            # One GPU per rank; CUDA_VISIBLE_DEVICES (placement.py) decides which.
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", device.index or 0)))
        _ensure_single_process_env()
        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")

        # Loaded in float32: with bf16/fp16 enabled DeepSpeed casts the module and keeps
        # float32 master weights in the optimizer. Attention goes by the packed layout, as in
        # TorchBackend, whatever config.json names: eager attention reads the packed rows' boolean
        # mask as 0/1 scores, a flash kernel takes no such mask (packed_attention.py).
        model = load_packed_attention_model(self.model_path, torch.float32)
        model.config.use_cache = False
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=t.lr, weight_decay=t.weight_decay
        )
        self.ds_config = build_deepspeed_config(config)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=self.ds_config)
        self.engine.train()
        self.device = self.engine.device

        # Frozen copy for the k3 KL penalty; under ZeRO-3 it is partitioned as well.
        self.reference: Any = None
        if t.kl_coef > 0:
            reference = load_packed_attention_model(self.model_path, torch.float32)
            reference.requires_grad_(False).eval()
            reference.config.use_cache = False
            if self.zero_stage == 3:
                reference_config = {k: v for k, v in self.ds_config.items() if k not in ("gradient_clipping", "managed_gradient_accumulation")}
                self.reference, _, _, _ = deepspeed.initialize(model=reference, config=reference_config)
                self.reference.eval()
            else:
                dtype = model_dtype(config.model.dtype)
                self.reference = reference.to(device=self.device, dtype=dtype)

        self.base_lr = t.lr
        self.version = 0
        self._set_lr()

    @classmethod
    def from_config(cls, config: RunConfig, model_path: str | Path) -> DeepSpeedBackend:
        """The backend of a run (`trainer.make_backend`); every backend is built from these two."""
        return cls(config=config, model_path=model_path)

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    @property
    def rank(self) -> int:
        return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0

    def _set_lr(self) -> float:
        t = self.config.trainer
        lr = self.base_lr * lr_multiplier(self.version, t.warmup_steps, t.schedule, t.max_steps)
        # engine.optimizer is the ZeRO wrapper (or the AdamW itself at stage 0); both
        # expose the inner optimizer's param_groups.
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # --- forward / backward / step -----------------------------------------------

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        temperature: float = 1.0, logit_source: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log p(token | context) and entropies, as TorchBackend's; attention by `packed_layout` (a
        function of the layer's query/key/value only, so ZeRO's partitioned parameters do not
        touch it: tests/rl_core/test_attention_exactness.py checks it at stages 0 and 3)."""
        return model_token_logprobs(
            self.engine, input_ids, attention_mask, position_ids, self.device, temperature, logit_source, packed_layout,
            target_ids)

    @torch.no_grad()
    def reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        temperature: float = 1.0, logit_source: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return reference_token_logprobs(
            self.reference, input_ids, attention_mask, position_ids, self.device, temperature, logit_source, packed_layout,
            target_ids)

    def backward(self, loss: torch.Tensor) -> None:
        # scale_wrt_gas=False: the loop already divides by the whole step's sequence count.
        self.engine.backward(loss, scale_wrt_gas=False)

    def optimizer_step(self) -> dict[str, float]:
        lr = self._set_lr()
        stage0_norm: torch.Tensor | None = None
        if self.zero_stage == 0:
            # Without ZeRO the engine reduces gradients inside step(), just before the
            # optimizer runs; clipping in a pre-step hook sees the reduced gradients.
            def clip_reduced(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
                nonlocal stage0_norm
                params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
                stage0_norm = torch.nn.utils.clip_grad_norm_(params, self.config.trainer.grad_clip)

            handle = self.engine.optimizer.register_step_pre_hook(clip_reduced)
            try:
                self.engine.step()
            finally:
                handle.remove()
            grad_norm = float(stage0_norm) if stage0_norm is not None else float("nan")
        else:
            self.engine.step()
            norm = self.engine.get_global_grad_norm()
            grad_norm = float(norm) if norm is not None else float("nan")
        self.version += 1
        return {"grad_norm": grad_norm, "lr": lr}

    # --- weights out -------------------------------------------------------------

    def _parameter_buckets(self) -> Iterator[list[tuple[str, torch.nn.Parameter]]]:
        bucket: list[tuple[str, torch.nn.Parameter]] = []
        size = 0
        for name, param in self.module.named_parameters():
            numel = int(param.ds_numel) if hasattr(param, "ds_numel") else param.numel()
            nbytes = numel * param.element_size()
            if bucket and size + nbytes > self.broadcast_bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, param))
            size += nbytes
        if bucket:
            yield bucket

    def parameters_for_broadcast(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full parameters in HF naming and `named_parameters` order (tied weights once).

        Under ZeRO-3 each bucket is all-gathered, copied out and re-partitioned before
        the next one, so at most one bucket of full tensors exists at a time beyond what
        the consumer keeps. Collective under ZeRO-3: iterate it on every trainer rank."""
        for bucket in self._parameter_buckets():
            if self.zero_stage == 3:
                params = [param for _, param in bucket]
                with self._deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                    gathered = [(name, param.detach().clone()) for name, param in bucket]
                yield from gathered
            else:
                for name, param in bucket:
                    yield name, param.detach()

    # --- checkpoints -------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> None:
        """HF weights (rank 0) + DeepSpeed optimizer state (every rank writes its shard)."""
        from safetensors.torch import save_file

        directory_path = Path(directory)
        directory_path.mkdir(parents=True, exist_ok=True)
        # Gathering is collective: every rank iterates, rank 0 keeps the tensors.
        state = {name: tensor.contiguous() for name, tensor in self.parameters_for_broadcast()}
        if self.rank == 0:
            save_file(state, str(directory_path / "model.safetensors"), metadata={"format": "pt"})
            self.module.config.save_pretrained(str(directory_path))
            generation_config = getattr(self.module, "generation_config", None)
            if generation_config is not None:
                generation_config.save_pretrained(str(directory_path))
            copy_side_files(self.model_path, directory_path)
        del state
        self.engine.save_checkpoint(
            str(directory_path / DEEPSPEED_STATE_DIR), tag=DEEPSPEED_TAG, client_state={"version": self.version}
        )
        if self.rank == 0:
            (directory_path / DEEPSPEED_STATE_DIR / "inflight_backend.json").write_text(
                json.dumps({"version": self.version, "zero_stage": self.zero_stage}) + "\n"
            )

    def load_checkpoint(self, directory: str) -> None:
        """Weights, optimizer state and version from a directory `save_checkpoint` wrote."""
        directory_path = Path(directory)
        state_dir = directory_path / DEEPSPEED_STATE_DIR
        marker = state_dir / "inflight_backend.json"
        if not marker.is_file():
            raise FileNotFoundError(
                f"checkpoint {directory_path}: no {DEEPSPEED_STATE_DIR}/ state (not written by the deepspeed backend?)"
            )
        saved = json.loads(marker.read_text())
        if int(saved["zero_stage"]) != self.zero_stage:
            # DeepSpeed's partitioned optimizer files are stage-specific.
            raise ValueError(
                f"checkpoint {directory_path} was written with trainer.zero_stage={saved['zero_stage']}, "
                f"this run uses {self.zero_stage}"
            )
        load_path, client_state = self.engine.load_checkpoint(
            str(state_dir), tag=DEEPSPEED_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if load_path is None:
            raise FileNotFoundError(f"checkpoint {directory_path}: DeepSpeed found no state under {state_dir}")
        self.version = int((client_state or {}).get("version", saved["version"]))
        self._set_lr()
