"""Three Ray nodes in three network namespaces: DeepSpeed ZeRO-2 trainer ranks on nodes 0 and 1
(their default group over gloo across the two namespaces), the inference server on node 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from netns_cluster import INTERFACE, NetnsCluster
from tests.metrics_file import read_metrics

pytestmark = [pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_zero2_ranks_on_two_nodes_train_and_update_the_server_on_a_third(three_node_cluster: NetnsCluster,
                                                                        tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "zero2.yaml"
    config.write_text(yaml.safe_dump({
        "name": "three-nodes-zero2",
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"backend": "deepspeed", "zero_stage": 2, "cpu_ranks": 2, "samples_per_step": 8, "max_steps": 3,
                    "checkpoint_every": 3},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
        "stream": {"kind": "redis", "redis_embedded": True},
        "cluster": {"enabled": True, "nodes": 3, "trainer_nodes": [0, 1], "server_nodes": [2],
                    "ray_address": three_node_cluster.address, "placement_timeout_s": 60, "network_interface": INTERFACE},
    }))
    out = tmp_path / "run"
    command = three_node_cluster.head.command([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"])
    result = subprocess.run(command, env=three_node_cluster.env(), capture_output=True, text=True, cwd=REPO_ROOT, timeout=900)
    logs = "".join((out / "logs" / f"{name}.log").read_text(errors="replace")[-2000:] for name in ("trainer", "trainer1")
                   if (out / "logs" / f"{name}.log").exists())
    assert result.returncode == 0, result.stdout + result.stderr + logs
    addresses = [node.address for node in three_node_cluster.nodes]
    assert f"node 0 ({addresses[0]}): trainer, actor" in result.stdout, result.stdout
    # Bundle 0 is pinned to the launcher's node; Ray picks which other machine holds bundles 1 and 2.
    rank1 = re.search(r"node 1 \(([0-9.]+)\): trainer1$", result.stdout, re.M)
    server = re.search(r"node 2 \(([0-9.]+)\): server0$", result.stdout, re.M)
    assert rank1 and server, result.stdout
    assert {rank1.group(1), server.group(1)} == set(addresses[1:]), result.stdout
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
    # Both ranks trained a share of every step; rank 0's broadcasts reached the server on node 2.
    shards = [json.loads(line) for line in (out / "trainer_shards.jsonl").read_text().splitlines()]
    for step in (1, 2, 3):
        assert {record["rank"] for record in shards if record["step"] == step} == {0, 1}, shards
    versions = [r["weights/version"] for r in read_metrics(out / "metrics.jsonl") if "weights/version" in r]
    assert max(versions) == 3.0
    assert (out / "checkpoints" / "latest").resolve().name == "step_000003"
