"""GPU placement of a run on one node: which process sees which GPUs.

A run on GPUs is `inference.num_servers` servers of `inference.gpus_per_server` GPUs
each (a vLLM server spreads its `tensor_parallel_size` workers over them) plus a
trainer on `trainer.gpus` GPUs (DeepSpeed ZeRO across them, one rank per GPU).
PipelineRL's default on an 8-GPU node is 4 + 4. `check_placement(config, gpus)`
assigns disjoint GPU sets — servers first, in index order, then the trainer — and
returns the `CUDA_VISIBLE_DEVICES` of every process, or refuses with a message that
names the fields and the numbers when the node cannot hold the run. A CPU run gets
`CUDA_VISIBLE_DEVICES=""` everywhere, so no process grabs a GPU by accident.

Inside each process the devices are renumbered from 0 by `CUDA_VISIBLE_DEVICES`,
so processes use plain `cuda` (a trainer rank uses `cuda:LOCAL_RANK`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from rl_core.config import RunConfig


class PlacementError(ValueError):
    """The node cannot run this config as asked; the message says why and what to change."""


@dataclass(frozen=True)
class ProcessPlacement:
    """One process (an inference server or the trainer) and the GPUs it may see."""

    role: str  # "server-0", "server-1", ..., "trainer"
    gpus: tuple[int, ...]  # physical indices on the node; empty on CPU

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(index) for index in self.gpus)

    @property
    def device(self) -> str:
        return "cuda" if self.gpus else "cpu"

    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.cuda_visible_devices}


@dataclass(frozen=True)
class Placement:
    servers: list[ProcessPlacement]
    trainer: ProcessPlacement
    tensor_parallel_size: int
    trainer_world_size: int  # DeepSpeed ranks (one per trainer GPU; 1 on CPU)
    zero_stage: int
    unused_gpus: tuple[int, ...] = field(default_factory=tuple)

    @property
    def gpus_used(self) -> int:
        return sum(len(server.gpus) for server in self.servers) + len(self.trainer.gpus)

    def summary(self) -> str:
        """One line per process, for the run log."""
        lines = [f"{p.role}: {'GPUs ' + p.cuda_visible_devices if p.gpus else 'CPU'}" for p in [*self.servers, self.trainer]]
        lines.append(
            f"tensor_parallel_size={self.tensor_parallel_size} trainer_world_size={self.trainer_world_size} "
            f"zero_stage={self.zero_stage} unused_gpus={list(self.unused_gpus)}"
        )
        return "\n".join(lines)


def detect_gpus() -> list[int]:
    """Physical indices of the GPUs this process may use: NVML's devices, narrowed by
    CUDA_VISIBLE_DEVICES when set (numeric form); [] without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver / no library: a CPU machine
        return []
    indices = list(range(count))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [item.strip() for item in visible.split(",") if item.strip()]
        if all(item.isdigit() for item in wanted):
            indices = [int(item) for item in wanted if int(item) < count]
    return indices


def check_placement(config: RunConfig, available_gpus: Sequence[int] | int) -> Placement:
    """Assign GPUs to every process of the run, or raise PlacementError.

    `available_gpus` is the node's usable GPU indices (or their count, meaning 0..n-1)."""
    gpus = list(range(available_gpus)) if isinstance(available_gpus, int) else [int(i) for i in available_gpus]
    if len(set(gpus)) != len(gpus) or any(index < 0 for index in gpus):
        raise PlacementError(f"available GPUs must be distinct non-negative indices, got {gpus}")
    inference, trainer = config.inference, config.trainer
    problems: list[str] = []

    # --- what each side asks for ---------------------------------------------------
    inference_on_gpu = inference.device.startswith("cuda")
    trainer_on_gpu = trainer.device.startswith("cuda")
    tp = inference.tensor_parallel_size
    if trainer.zero_stage > 0 and trainer.backend != "deepspeed":
        problems.append(f"trainer.zero_stage={trainer.zero_stage} needs trainer.backend 'deepspeed' (it is {trainer.backend!r})")

    if inference_on_gpu:
        per_server = inference.gpus_per_server or tp
        if inference.engine == "reference" and (per_server != 1 or tp != 1):
            problems.append(
                "inference.engine 'reference' runs on one GPU per server: set inference.gpus_per_server=1 and "
                f"inference.tensor_parallel_size=1 (got {inference.gpus_per_server} and {tp}), or use engine 'vllm'"
            )
        elif per_server != tp:
            problems.append(
                f"inference.gpus_per_server={per_server} must equal inference.tensor_parallel_size={tp} "
                "(one vLLM tensor-parallel worker per GPU)"
            )
    else:
        per_server = 0
        if inference.gpus_per_server:
            problems.append(f"inference.gpus_per_server={inference.gpus_per_server} but inference.device is {inference.device!r}")
        if tp != 1:
            problems.append(f"inference.tensor_parallel_size={tp} needs GPUs; inference.device is {inference.device!r}")

    if trainer_on_gpu:
        trainer_gpus = trainer.gpus or 1
        if trainer.backend == "torch" and trainer_gpus != 1:
            problems.append(f"trainer.backend 'torch' trains on one GPU; trainer.gpus={trainer.gpus} needs trainer.backend 'deepspeed'")
    else:
        trainer_gpus = 0
        if trainer.gpus:
            problems.append(f"trainer.gpus={trainer.gpus} but trainer.device is {trainer.device!r}")
    if problems:
        raise PlacementError("; ".join(problems))

    # --- does the node hold it? ------------------------------------------------------
    needed = inference.num_servers * per_server + trainer_gpus
    if needed > len(gpus):
        raise PlacementError(
            f"the run needs {needed} GPUs ({inference.num_servers} server(s) x {per_server} (inference.num_servers x "
            f"inference.gpus_per_server) + {trainer_gpus} for the trainer (trainer.gpus)) but the node has "
            f"{len(gpus)}{' (' + ','.join(map(str, gpus)) + ')' if gpus else ''}"
        )

    # --- assign: servers first, then the trainer -------------------------------------
    cursor = 0
    servers = []
    for index in range(inference.num_servers):
        servers.append(ProcessPlacement(f"server-{index}", tuple(gpus[cursor : cursor + per_server])))
        cursor += per_server
    trainer_placement = ProcessPlacement("trainer", tuple(gpus[cursor : cursor + trainer_gpus]))
    cursor += trainer_gpus
    return Placement(
        servers=servers,
        trainer=trainer_placement,
        tensor_parallel_size=tp if inference_on_gpu else 1,
        trainer_world_size=max(1, trainer_gpus),
        zero_stage=int(trainer.zero_stage),
        unused_gpus=tuple(gpus[cursor:]),
    )


def even_split(num_gpus: int, tensor_parallel_size: int = 1) -> dict[str, int]:
    """PipelineRL's split of a node: half the GPUs to inference (whole servers of
    `tensor_parallel_size`), the rest to the trainer. Returns config field values."""
    if num_gpus < 2:
        raise PlacementError(f"an inference + training split needs at least 2 GPUs, the node has {num_gpus}")
    if tensor_parallel_size < 1 or tensor_parallel_size > num_gpus - 1:
        raise PlacementError(f"inference.tensor_parallel_size={tensor_parallel_size} leaves no GPU for the trainer on {num_gpus} GPUs")
    servers = max(1, (num_gpus // 2) // tensor_parallel_size)
    inference_gpus = servers * tensor_parallel_size
    return {"inference.num_servers": servers, "inference.gpus_per_server": tensor_parallel_size,
            "inference.tensor_parallel_size": tensor_parallel_size, "trainer.gpus": num_gpus - inference_gpus}
