"""What each child of a run runs with (`launcher.py`'s step 2): the command and environment of
every inference server and trainer rank, built by pure functions, so the GPU placement of the
children is tested without starting anything.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rl_core.cluster.placement import Placement
from rl_core.config.run_config import RunConfig
from rl_core.rundir.role_args import role_flags


@dataclass(frozen=True)
class ChildSpec:
    """One child process: its name (log file `logs/<name>.log`), command and the
    environment variables it gets on top of the launcher's."""

    name: str
    command: list[str]
    env: dict[str, str]


def server_children(config: RunConfig, placement: Placement, run_dir: str | Path, serve_model: str | Path, python: str = sys.executable,
                    vllm_python: str | None = None, hosts: list[str | None] | None = None) -> list[ChildSpec]:
    """One spec per inference server, each seeing only its own GPUs. A server reads its
    settings from the run directory's config.yaml; its command line names only the run
    directory, which server it is, the weights (the model or a resumed checkpoint) and its port.
    `hosts`: the address each server listens on (its node's, on a cluster; None: localhost)."""
    c = config
    specs = []
    for index, where in enumerate(placement.servers):
        port = c.inference.base_port + index if c.inference.base_port else 0
        env = where.env()
        run_args = ["--run-dir", str(run_dir), "--server-index", str(index), "--model", str(serve_model), "--port", str(port)]
        host = hosts[index] if hosts is not None else None
        if host is not None:
            run_args += ["--host", host]
        if c.inference.engine == "vllm":
            from rl_core.inference.vllm_engine import REPO_ROOT, server_command

            # vLLM lives in its own virtualenv; it finds rl_core through PYTHONPATH.
            # Its --tensor-parallel-size workers spread over exactly the GPUs in `env`.
            path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
            env.update(PYTHONPATH=path, OMP_NUM_THREADS=str(c.inference.threads_per_server))
            specs.append(ChildSpec(f"server{index}", server_command(run_args, python=vllm_python), env))
            continue
        specs.append(ChildSpec(f"server{index}", [python, "-m", "rl_core", "serve", *run_args], env))
    return specs


def trainer_children(config: RunConfig, placement: Placement, run_dir: Path, model_path: str | Path,
                     server_urls: list[str] | None, resume: bool, master_port: int, python: str = sys.executable,
                     master_address: str = "127.0.0.1", rank_nodes: list[int] | None = None) -> list[ChildSpec]:
    """One spec per trainer rank. Rank 0 is named `trainer` (it publishes progress,
    metrics and checkpoints and broadcasts the weights); rank r > 0 is `trainer<r>`.
    `server_urls` None: the ranks read them from the run directory's servers.json.
    `master_address`: rank 0's address (its node's, on a cluster); `rank_nodes`: each rank's
    node on a cluster, so that LOCAL_RANK / LOCAL_WORLD_SIZE count the ranks of one node."""
    args = ["trainer", *role_flags(run_dir, server_urls), "--model", str(model_path),
            "--weight-sync-backend", placement.weight_sync_backend]
    if resume:
        args.append("--resume")
    specs = []
    for rank in range(placement.trainer_world_size):
        if placement.trainer_world_size > 1:
            env = placement.rank_env(rank, master_port, master_address)
            if rank_nodes is not None and not (placement.trainer_ranks and placement.trainer_ranks[rank].gpus):
                node_ranks = [other for other in range(placement.trainer_world_size) if rank_nodes[other] == rank_nodes[rank]]
                env.update(LOCAL_RANK=str(node_ranks.index(rank)), LOCAL_WORLD_SIZE=str(len(node_ranks)))
        else:
            env = (placement.trainer_ranks[0] if placement.trainer_ranks else placement.trainer).env()
        specs.append(ChildSpec("trainer" if rank == 0 else f"trainer{rank}", [python, "-m", "rl_core", *args], env))
    return specs
