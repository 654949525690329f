"""GPU placement of a run on one node: which process sees which GPUs.

A run on GPUs is `inference.num_servers` servers of `inference.gpus_per_server` GPUs
each (a vLLM server spreads its `tensor_parallel_size` workers over them) plus a
trainer on `trainer.gpus` GPUs (DeepSpeed ZeRO across them, one rank per GPU).
PipelineRL's default on an 8-GPU node is 4 + 4. `check_placement(config, gpus)`
assigns disjoint GPU sets — servers first, in index order, then the trainer ranks —
and returns the `CUDA_VISIBLE_DEVICES` of every process, or refuses with a message
that names the fields and the numbers when the node cannot hold the run. A CPU run
gets `CUDA_VISIBLE_DEVICES=""` everywhere, so no process grabs a GPU by accident.
`trainer.share_inference_gpus` colocates the trainer ranks on the servers' GPUs
instead (one GPU for everything, as `scripts/gpu_smoke.sh` does on a 1-GPU machine).
The placement also picks how weights reach the servers (`choose_weight_handoff`): in memory
both sides see when they share one device (`weights/handoff.py`), else a torch.distributed
broadcast (`weights/sync.py`, gloo or NCCL).

Inside each process the devices are renumbered from 0 by `CUDA_VISIBLE_DEVICES`:
a server uses `cuda` (its tensor-parallel workers `cuda:0..tp-1`), and a trainer rank
sees exactly its own GPU as `cuda:0`, so its LOCAL_RANK — the device index DeepSpeed
uses — is 0 while RANK/WORLD_SIZE give its data-parallel position (`rank_env`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

from rl_core.config.run_config import RunConfig


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
    trainer: ProcessPlacement  # all the trainer's GPUs together (what the node gives to training)
    tensor_parallel_size: int
    trainer_world_size: int  # DeepSpeed ranks (one per trainer GPU; trainer.cpu_ranks on CPU)
    zero_stage: int
    unused_gpus: tuple[int, ...] = field(default_factory=tuple)
    trainer_ranks: list[ProcessPlacement] = field(default_factory=list)  # one process per rank, in rank order
    shared_gpus: bool = False  # trainer ranks colocated on the servers' GPUs
    weight_sync_backend: str = "gloo"  # torch.distributed backend of the trainer -> servers broadcast
    weight_handoff: str = "collective"  # "same_device" (weight_handoff.py) or "collective" (the broadcast above)

    @property
    def gpus_used(self) -> int:
        on_servers = sum(len(server.gpus) for server in self.servers)
        return on_servers if self.shared_gpus else on_servers + len(self.trainer.gpus)

    def summary(self) -> str:
        """One line per process, for the run log."""
        processes = [*self.servers, *(self.trainer_ranks or [self.trainer])]
        lines = [f"{p.role}: {'GPUs ' + p.cuda_visible_devices if p.gpus else 'CPU'}" for p in processes]
        lines.append(
            f"tensor_parallel_size={self.tensor_parallel_size} trainer_world_size={self.trainer_world_size} "
            f"zero_stage={self.zero_stage} weight_handoff={self.weight_handoff} weight_sync={self.weight_sync_backend} "
            f"shared_gpus={self.shared_gpus} unused_gpus={list(self.unused_gpus)}"
        )
        return "\n".join(lines)

    def rank_env(self, rank: int, master_port: int, master_address: str = "127.0.0.1") -> dict[str, str]:
        """Environment of trainer rank `rank`: torch.distributed's rendezvous variables and
        its GPU. A GPU rank sees only its own GPU, so its LOCAL_RANK is 0; CPU ranks count
        LOCAL_RANK like torchrun (DeepSpeed's CPU comm op orders them by it)."""
        if not 0 <= rank < self.trainer_world_size:
            raise ValueError(f"rank must be in 0..{self.trainer_world_size - 1}, got {rank}")
        process = self.trainer_ranks[rank] if self.trainer_ranks else self.trainer
        return {
            **process.env(),
            "RANK": str(rank),
            "WORLD_SIZE": str(self.trainer_world_size),
            "LOCAL_RANK": "0" if process.gpus else str(rank),
            "LOCAL_WORLD_SIZE": str(self.trainer_world_size),
            "MASTER_ADDR": master_address,
            "MASTER_PORT": str(master_port),
        }


def same_device_obstacle(config: RunConfig) -> str | None:
    """Why the trainer and the servers of `config` do not share one device (None: they do, so
    weights can be handed over in memory both see, `weights/handoff.py`): one node, the reference
    engine, and every server on the trainer's device (all on the CPU, or one server on the one
    GPU the trainer shares with `trainer.share_inference_gpus`)."""
    inference, trainer = config.inference, config.trainer
    if config.cluster.enabled:
        return "cluster.enabled puts the roles on several nodes"
    if inference.engine != "reference":
        return f"inference.engine {inference.engine!r} takes weights over the process group only"
    if inference.device == "cpu" and trainer.device == "cpu":
        return None
    if not (inference.device.startswith("cuda") and trainer.device.startswith("cuda") and trainer.share_inference_gpus):
        return (f"the servers ({inference.device!r}) and the trainer ({trainer.device!r}) are on different devices "
                "(on one GPU: trainer.share_inference_gpus)")
    if inference.num_servers != 1:
        return f"inference.num_servers={inference.num_servers}: only server 0 is on the trainer's GPU"
    return None


def choose_weight_handoff(config: RunConfig) -> str:
    """`inference.weight_handoff` resolved: "same_device" or "collective"; PlacementError when
    same_device is asked where it cannot be."""
    wanted = config.inference.weight_handoff
    obstacle = same_device_obstacle(config)
    if wanted == "same_device" and obstacle is not None:
        raise PlacementError(f"inference.weight_handoff 'same_device' needs the trainer and every server on one device: {obstacle}")
    if wanted == "collective" or obstacle is not None:
        return "collective"
    return "same_device"


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
        world_size = trainer_gpus
        if trainer.backend == "torch" and trainer_gpus != 1:
            problems.append(f"trainer.backend 'torch' trains on one GPU; trainer.gpus={trainer.gpus} needs trainer.backend 'deepspeed'")
        if trainer.cpu_ranks != 1:
            problems.append(f"trainer.cpu_ranks={trainer.cpu_ranks} is for trainer.device 'cpu'; on GPUs set trainer.gpus (one rank per GPU)")
    else:
        trainer_gpus = 0
        world_size = trainer.cpu_ranks
        if trainer.gpus:
            problems.append(f"trainer.gpus={trainer.gpus} but trainer.device is {trainer.device!r}")
        if trainer.cpu_ranks > 1 and trainer.backend != "deepspeed":
            problems.append(f"trainer.cpu_ranks={trainer.cpu_ranks} needs trainer.backend 'deepspeed' (the torch backend is one process)")
    shared = trainer.share_inference_gpus
    if shared and not (trainer_on_gpu and inference_on_gpu):
        problems.append("trainer.share_inference_gpus needs inference.device and trainer.device both on cuda")
    elif shared and trainer_gpus > inference.num_servers * per_server:
        problems.append(
            f"trainer.share_inference_gpus: trainer.gpus={trainer_gpus} but the servers hold only "
            f"{inference.num_servers * per_server} GPU(s) to share"
        )
    if problems:
        raise PlacementError("; ".join(problems))
    handoff = choose_weight_handoff(config)

    # --- does the node hold it? ------------------------------------------------------
    needed = inference.num_servers * per_server + (0 if shared else trainer_gpus)
    if needed > len(gpus):
        trainer_part = "0 more for the trainer (trainer.share_inference_gpus)" if shared else f"{trainer_gpus} for the trainer (trainer.gpus)"
        raise PlacementError(
            f"the run needs {needed} GPUs ({inference.num_servers} server(s) x {per_server} (inference.num_servers x "
            f"inference.gpus_per_server) + {trainer_part}) but the node has "
            f"{len(gpus)}{' (' + ','.join(map(str, gpus)) + ')' if gpus else ''}"
        )

    # --- assign: servers first, then the trainer ranks -------------------------------
    cursor = 0
    servers = []
    for index in range(inference.num_servers):
        servers.append(ProcessPlacement(f"server-{index}", tuple(gpus[cursor : cursor + per_server])))
        cursor += per_server
    trainer_start = 0 if shared else cursor
    trainer_placement = ProcessPlacement("trainer", tuple(gpus[trainer_start : trainer_start + trainer_gpus]))
    if not shared:
        cursor += trainer_gpus
    if trainer_on_gpu:
        ranks = [ProcessPlacement(f"trainer-rank{rank}", (gpu,)) for rank, gpu in enumerate(trainer_placement.gpus)]
    else:
        ranks = [ProcessPlacement(f"trainer-rank{rank}", ()) for rank in range(world_size)]
    # NCCL moves GPU memory directly but refuses two ranks on one GPU; gloo goes through host memory.
    sync_backend = "nccl" if inference_on_gpu and trainer_on_gpu and not shared else "gloo"
    return Placement(
        servers=servers,
        trainer=trainer_placement,
        tensor_parallel_size=tp if inference_on_gpu else 1,
        trainer_world_size=world_size,
        zero_stage=int(trainer.zero_stage),
        unused_gpus=tuple(gpus[cursor:]),
        trainer_ranks=ranks,
        shared_gpus=shared,
        weight_sync_backend=sync_backend,
        weight_handoff=handoff,
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
