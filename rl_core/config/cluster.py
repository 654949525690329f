"""The run config's `cluster` section: one run across several machines (README "Several machines").

Its own module because it is its own concern (Ray placement, `cluster/layout.py`,
`cluster/ray_placement.py`); `rl_core.config.run_config.RunConfig` holds it as `cluster` like any other section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_core.config.section import ConfigSection


class ClusterConfig(ConfigSection):
    """One run across several machines of a Ray cluster (rl_core/cluster/ray_placement.py). Off: today's
    single-node launch, and Ray is never imported. README "Several machines" has the rules."""

    enabled: bool = Field(
        False,
        description="Run the roles on the nodes of a Ray cluster (a placement group reserves all of them at once) "
        "instead of as local processes.",
    )
    nodes: int = Field(2, ge=1, le=256, description="Nodes the run reserves, one placement-group bundle each (STRICT_SPREAD).")
    layout: Literal["split", "spread"] = Field(
        "split",
        description="Default role mapping: `split` = trainer ranks and actor on node 0, inference servers on nodes "
        "1..N-1 (node 0 too when nodes=1); `spread` = trainer ranks then servers round-robin over every node.",
    )
    trainer_nodes: list[int] | None = Field(
        None, description="Node of each trainer rank, cycled in rank order (overrides `layout` for the trainer)."
    )
    server_nodes: list[int] | None = Field(
        None, description="Node of each inference server, cycled in server order (overrides `layout` for servers)."
    )
    actor_node: int = Field(0, ge=0, description="Node of the rollout actor.")
    ray_address: str = Field(
        "auto",
        description="The Ray head's GCS address, `host:port` (what `ray start --address` takes); `auto` = the "
        "cluster this machine belongs to (RAY_ADDRESS or the local head). The token comes from RAY_AUTH_TOKEN.",
    )
    placement_timeout_s: float = Field(
        300.0, gt=0, description="Wait this long for the placement group (every node at once), then fail saying what the cluster lacks."
    )
    cpus_per_process: float = Field(
        1.0, gt=0, description="Ray logical CPUs reserved per role process (server, trainer rank, actor) in its node's bundle."
    )
    network_interface: str | None = Field(
        None,
        description="Interface the weight group and DeepSpeed's collectives use on every node "
        "(GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), e.g. `eth0`; unset = the libraries' own choice.",
    )
    advertised_address: str | None = Field(
        None,
        description="Address of the launcher's node that the other nodes reach (its Redis stream listens there); "
        "unset = the address this machine uses to reach the Ray head.",
    )
    node0_is_launcher_node: bool = Field(
        True,
        description="Node 0 is the machine the launcher runs on (it must then be a node of the cluster): the trainer "
        "sits next to the run's Redis and run directory. Off: Ray picks which node is node 0.",
    )
    node_lost_grace_s: float = Field(
        2.0, ge=0, description="After a node is reported dead, wait this long for its roles' own errors before failing the run."
    )

    @model_validator(mode="after")
    def _nodes_in_range(self) -> ClusterConfig:
        for name in ("trainer_nodes", "server_nodes"):
            indices = getattr(self, name)
            if indices is None:
                continue
            if not indices:
                raise ValueError(f"cluster.{name} must name at least one node (or be left unset)")
            bad = [index for index in indices if not 0 <= index < self.nodes]
            if bad:
                raise ValueError(f"cluster.{name}: node(s) {bad} out of range 0..{self.nodes - 1} (cluster.nodes={self.nodes})")
        if self.actor_node >= self.nodes:
            raise ValueError(f"cluster.actor_node={self.actor_node} out of range 0..{self.nodes - 1} (cluster.nodes={self.nodes})")
        return self
