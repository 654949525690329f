"""Which node of a cluster run each role goes on, and what each node's bundle reserves.

Pure (no Ray): the launcher checks a cluster request before connecting to anything, and the
tests check the layouts without a cluster. `rl_core/cluster/ray_placement.py` turns the result into a
Ray placement group, one bundle per node, reserved all at once (STRICT_SPREAD: every bundle on
a different node).

Role names are the launcher's child names: `server<i>`, `trainer` (rank 0), `trainer<r>`,
`actor`. `cluster.layout` gives the default mapping; `cluster.trainer_nodes` /
`cluster.server_nodes` / `cluster.actor_node` override it per role.
"""

from __future__ import annotations

from dataclasses import dataclass

from rl_core.config.run_config import RunConfig
from rl_core.cluster.placement import Placement
from rl_core.rundir.heartbeats import trainer_rank_name


class ClusterError(RuntimeError):
    """A cluster run that cannot start (bad request, no placement group, a lost node); the message names why."""


@dataclass(frozen=True)
class RoleSlot:
    """One process of a cluster run: its child name, its node and the GPUs Ray must give it."""

    name: str
    node: int
    gpus: int


def role_slots(config: RunConfig, placement: Placement) -> list[RoleSlot]:
    """Every process of the run with its node index, in start order (servers, trainer ranks, actor)."""
    cluster = config.cluster
    nodes = cluster.nodes
    servers = config.inference.num_servers
    ranks = placement.trainer_world_size
    if cluster.layout == "spread":
        # Trainer ranks from node 0 up, the servers continuing where the ranks stopped.
        default_trainer = [rank % nodes for rank in range(ranks)]
        default_server = [(ranks + index) % nodes for index in range(servers)]
    else:  # split: training on node 0, inference on the others
        default_trainer = [0]
        default_server = list(range(1, nodes)) or [0]
    trainer_nodes = cluster.trainer_nodes or default_trainer
    server_nodes = cluster.server_nodes or default_server
    slots = [RoleSlot(f"server{index}", server_nodes[index % len(server_nodes)], len(where.gpus))
             for index, where in enumerate(placement.servers)]
    for rank in range(ranks):
        rank_gpus = len(placement.trainer_ranks[rank].gpus) if placement.trainer_ranks else len(placement.trainer.gpus)
        slots.append(RoleSlot(trainer_rank_name(rank), trainer_nodes[rank % len(trainer_nodes)], rank_gpus))
    slots.append(RoleSlot("actor", cluster.actor_node, 0))
    return slots


def node_bundles(config: RunConfig, slots: list[RoleSlot]) -> list[dict[str, float]]:
    """One Ray bundle per node: `cluster.cpus_per_process` logical CPUs per process on it, plus its GPUs."""
    bundles: list[dict[str, float]] = [{"CPU": 0.0} for _ in range(config.cluster.nodes)]
    for slot in slots:
        bundle = bundles[slot.node]
        bundle["CPU"] += config.cluster.cpus_per_process
        if slot.gpus:
            bundle["GPU"] = bundle.get("GPU", 0.0) + slot.gpus
    return bundles


def check_cluster_request(config: RunConfig, slots: list[RoleSlot]) -> None:
    """Refuse, naming the fields, a cluster request that could not run whatever the cluster holds."""
    problems = []
    if config.stream.kind != "redis":
        problems.append("stream.kind must be 'redis' on a cluster (cluster.enabled): the file stream needs one "
                        "filesystem for the actor and the trainer; set stream.redis_embedded=true for the run's own "
                        "password-protected Redis on the launcher's node")
    idle = sorted(set(range(config.cluster.nodes)) - {slot.node for slot in slots})
    if idle:
        problems.append(f"cluster.nodes={config.cluster.nodes} but no role is placed on node(s) {idle} "
                        "(cluster.layout / cluster.trainer_nodes / cluster.server_nodes / cluster.actor_node): "
                        "a reserved node would sit idle")
    if problems:
        raise ClusterError("; ".join(problems))


def layout_summary(slots: list[RoleSlot], addresses: dict[int, str] | None = None) -> str:
    """One line per node for the run log: `node 1 (10.0.0.2): server0`."""
    lines = []
    for node in sorted({slot.node for slot in slots}):
        where = f" ({addresses[node]})" if addresses and node in addresses else ""
        names = ", ".join(slot.name for slot in slots if slot.node == node)
        lines.append(f"node {node}{where}: {names}")
    return "\n".join(lines)


# A cluster's GPUs are counted by Ray on each node, not here: only the request's shape is checked.
CLUSTER_GPU_CEILING = 4096


def plan_cluster_run(config: RunConfig) -> tuple[Placement, list[RoleSlot]]:
    """A cluster run's processes (the single-node placement, its GPU count unbounded) and the node
    of each, refused with a ClusterError naming the fields when it could not run on any cluster.
    The launcher and the platform's submit check (`inflight.runs.run_limits`) both ask here."""
    from dataclasses import replace

    from rl_core.cluster.placement import PlacementError, check_placement

    try:
        placement = replace(check_placement(config, CLUSTER_GPU_CEILING), unused_gpus=())
    except PlacementError as exc:
        raise ClusterError(f"placement: {exc}") from exc
    slots = role_slots(config, placement)
    check_cluster_request(config, slots)
    return placement, slots
