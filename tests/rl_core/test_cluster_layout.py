"""The cluster section of the config and the role layout of a cluster run (no Ray, no cluster:
rl_core/cluster/layout.py is pure). The runs on a real cluster are in tests/multinode/."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_core.cluster.layout import ClusterError, check_cluster_request, layout_summary, node_bundles, role_slots
from rl_core.config.run_config import RunConfig
from rl_core.config.files import ConfigError, load_config
from rl_core.launch.launcher import LaunchError, place_cluster_run, trainer_children
from rl_core.cluster.placement import check_placement


def cluster_run(**cluster: object) -> RunConfig:
    return RunConfig(stream={"kind": "redis", "redis_embedded": True}, cluster={"enabled": True, **cluster})


def test_split_layout_puts_training_on_node_0_and_servers_on_the_others() -> None:
    config = cluster_run(nodes=3)
    config.inference.num_servers = 4
    placement, slots = place_cluster_run(config)
    where = {slot.name: slot.node for slot in slots}
    assert where == {"server0": 1, "server1": 2, "server2": 1, "server3": 2, "trainer": 0, "actor": 0}
    assert node_bundles(config, slots) == [{"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 2.0}]
    assert layout_summary(slots, {0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"}).splitlines()[0] == "node 0 (10.0.0.1): trainer, actor"


def test_spread_layout_puts_deepspeed_ranks_on_different_nodes_with_their_own_local_ranks() -> None:
    config = cluster_run(nodes=3, layout="spread")
    config.trainer.backend, config.trainer.zero_stage, config.trainer.cpu_ranks = "deepspeed", 2, 2
    placement, slots = place_cluster_run(config)
    where = {slot.name: slot.node for slot in slots}
    assert where == {"trainer": 0, "trainer1": 1, "server0": 2, "actor": 0}
    specs = trainer_children(config, placement, "/run", "/model", None, False, 29500, master_address="10.0.0.1",
                             rank_nodes=[where["trainer"], where["trainer1"]])
    assert [spec.env["MASTER_ADDR"] for spec in specs] == ["10.0.0.1", "10.0.0.1"]
    assert [(spec.env["RANK"], spec.env["LOCAL_RANK"], spec.env["LOCAL_WORLD_SIZE"]) for spec in specs] == [("0", "0", "1"), ("1", "0", "1")]


def test_gpus_of_a_cluster_run_go_into_the_bundles_not_onto_this_node() -> None:
    config = cluster_run(nodes=2)
    config.inference.device, config.inference.gpus_per_server = "cuda", 1
    config.trainer.device, config.trainer.backend, config.trainer.gpus = "cuda", "deepspeed", 2
    placement, slots = place_cluster_run(config)  # this machine has no GPU: Ray counts the cluster's
    assert node_bundles(config, slots) == [{"CPU": 3.0, "GPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}]
    assert placement.weight_sync_backend == "nccl"


def test_a_cluster_request_that_cannot_run_names_the_fields() -> None:
    config = RunConfig(cluster={"enabled": True, "nodes": 3})
    with pytest.raises(LaunchError) as error:
        place_cluster_run(config)
    assert "stream.kind must be 'redis'" in str(error.value)
    assert "no role is placed on node(s) [2]" in str(error.value)  # one server: node 2 would sit idle
    config = cluster_run(nodes=2)
    with pytest.raises(ClusterError, match="stream.kind"):
        config.stream.kind = "file"
        check_cluster_request(config, role_slots(config, check_placement(config, 0)))


def test_cluster_fields_out_of_range_are_refused_naming_the_field(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("cluster:\n  enabled: true\n  nodes: 2\n  server_nodes: [2]\n")
    with pytest.raises(ConfigError, match=r"cluster.server_nodes: node\(s\) \[2\] out of range 0..1"):
        load_config(path)
    path.write_text("cluster:\n  nodes: 2\n  actor_node: 5\n")
    with pytest.raises(ConfigError, match="cluster.actor_node=5 out of range"):
        load_config(path)


def test_a_single_node_run_never_imports_ray() -> None:
    code = ("import sys, rl_core.launch.launcher, rl_core.cluster.role_hosts, rl_core.cluster.layout, rl_core.rundir.stream, rl_core.weights.sync; "
            "print('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
