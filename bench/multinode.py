"""What crossing machines costs a run, on one machine: each "node" a network namespace of its
own joined by a veth pair (tests/multinode/netns_cluster.py; `--bridge`: through the tests'
bridge instead), so traffic between roles really
crosses interfaces. The cores are the same two either way, so no speed-up can show here; the
figures say what the crossing itself costs.

- `update_pause_cross_node_over_local`: the in-flight update pause of a real reference server
  that keeps decoding while a trainer broadcasts the ~125M model (bench/weight_update.py's
  measurement), the server on another namespace (gloo over eth0 of both) over the same with
  server and trainer in one namespace (gloo over its loopback). Goal <= 1.3.
- `time_to_plus20_two_nodes_over_one`: the demo (examples/tiny-cpu.yaml) to +20 held-out points,
  from `python -m rl_core run` to the evaluation that reaches it: on a 2-node Ray cluster
  (trainer and actor on node 0, the server on node 1, the stream in the run's Redis) over the
  single-node demo. Goal <= 1.15.
- `placement_group_wait_s`, and `startup_two_nodes_over_one`: launch to every server ready
  (servers.json written) on the cluster over the same on one node.

    .venv/bin/python bench/multinode.py [--updates 3] [--steps 30]

Needs root (ip netns). About 6 minutes on a quiet 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchlib import REPO_ROOT, build_model, updates_while_decoding  # noqa: F401  (first: it puts the checkout on sys.path)

sys.path.insert(0, str(REPO_ROOT / "tests" / "multinode"))
from netns_cluster import INTERFACE, NetnsCluster, netns_usable  # noqa: E402

from tests.metrics_file import read_metrics  # noqa: E402
from tests.rl_core.server_process import start_server_process  # noqa: E402
from rl_core.weight_sync import ADVERTISED_ADDRESS_ENV  # noqa: E402

GAIN = 0.20


# --- the update pause ----------------------------------------------------------------------


def pause_worker(url: str, model_dir: str, updates: int) -> None:
    """Run inside a namespace: this process is the trainer; print the server's pauses as JSON."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.weight_sync import DEFAULT_BUCKET_BYTES

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    named = [(name, parameter.detach()) for name, parameter in model.named_parameters()]
    pauses, broadcasts = updates_while_decoding(url, named, updates, DEFAULT_BUCKET_BYTES)
    print(json.dumps({"pauses": pauses, "broadcasts": broadcasts}), flush=True)


def measure_pauses(cluster: NetnsCluster, model_dir: Path, updates: int, server_node: int) -> dict[str, list[float]]:
    """Server on `server_node`, trainer on node 0; on node 0 too, everything goes over its loopback."""
    trainer = cluster.nodes[0]
    server = cluster.nodes[server_node]
    host = "127.0.0.1" if server_node == 0 else server.address
    command = server.command([sys.executable, "-m", "rl_core", "serve", "--model", str(model_dir), "--host", host,
                              "--port", "0", "--max-batch-size", "8"])
    process = start_server_process(command, timeout_s=300, env=cluster.env(), what=f"server on node {server_node}")
    try:
        env = {**cluster.env(), ADVERTISED_ADDRESS_ENV: "127.0.0.1" if server_node == 0 else trainer.address}
        result = subprocess.run(trainer.command([sys.executable, str(Path(__file__).resolve()), "--pause-worker", process.url,
                                                 "--model-dir", str(model_dir), "--updates", str(updates)]),
                                env=env, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
        if result.returncode != 0:
            raise SystemExit(f"pause worker failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        process.stop()


# --- the demo on one node and on two -----------------------------------------------------------


def demo_config(scratch: Path, steps: int, cluster: NetnsCluster | None) -> Path:
    config = yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text())
    config["trainer"].update(max_steps=steps, checkpoint_every=0)
    if cluster is not None:
        config["stream"] = {"kind": "redis", "redis_embedded": True}
        config["cluster"] = {"enabled": True, "nodes": 2, "ray_address": cluster.address, "placement_timeout_s": 120,
                             "network_interface": INTERFACE}
    path = scratch / ("two-nodes.yaml" if cluster else "one-node.yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def run_demo(config: Path, out: Path, cluster: NetnsCluster | None) -> dict[str, float | None]:
    argv = [sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"]
    command = cluster.head.command(argv) if cluster else argv
    env = cluster.env() if cluster else dict(os.environ)
    launched = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=1200)
    if result.returncode != 0:
        raise SystemExit(f"{config.name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    records = read_metrics(out / "metrics.jsonl")
    heldout = [(r["step"], r["t"], r["success/heldout"]) for r in records if "success/heldout" in r]
    target = heldout[0][2] + GAIN - 1e-12
    reached = next(((step, t) for step, t, value in heldout if value >= target), None)
    wait = re.search(r"placement group ready after ([0-9.]+) s", result.stdout)
    return {
        "to_plus20_s": None if reached is None else reached[1] - launched,
        "step": None if reached is None else reached[0],
        "startup_s": (out / "servers.json").stat().st_mtime - launched,
        "placement_wait_s": float(wait.group(1)) if wait else None,
        "curve": " ".join(f"{step}:{value:.2f}" for step, _, value in heldout),  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bridge", action="store_true", help="Join the nodes through a bridge (as the tests do), not a veth pair.")
    parser.add_argument("--pause-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pause_worker:
        pause_worker(args.pause_worker, args.model_dir, args.updates)
        return
    why = netns_usable()
    if why is not None:
        raise SystemExit(f"bench/multinode.py: {why}")
    # A veth pair straight between the two nodes: the tests' bridge costs the host's bridge netfilter
    # on every frame (RESULTS.md), which is this sandbox's, not a network's.
    cluster = NetnsCluster.create(nodes=2, point_to_point=not args.bridge)
    try:
        with tempfile.TemporaryDirectory() as scratch_dir:
            scratch = Path(scratch_dir)
            model_dir = scratch / "model-125m"
            build_model(model_dir)
            local = measure_pauses(cluster, model_dir, args.updates, server_node=0)
            remote = measure_pauses(cluster, model_dir, args.updates, server_node=1)
            one = run_demo(demo_config(scratch, args.steps, None), scratch / "one", None)
            cluster.start_ray(cpus_per_node=3)
            two = run_demo(demo_config(scratch, args.steps, cluster), scratch / "two", cluster)
    finally:
        cluster.close()

    print(f"~125M model, gloo, {args.updates} updates while decoding; server pause s (trainer broadcast s):")
    for name, figures in (("same node (loopback)", local), ("other node (veth)", remote)):
        pairs = " ".join(f"{p:.3f} ({b:.3f})" for p, b in zip(figures["pauses"], figures["broadcasts"]))
        print(f"  {name:22} {pairs}")
    print(f"demo to +{GAIN:.2f} held-out ({args.steps} steps at most):")
    for name, figures in (("one node", one), ("two nodes", two)):
        print(f"  {name:10} start-up {figures['startup_s']:.1f} s, +20 at step {figures['step']} after "
              f"{figures['to_plus20_s'] if figures['to_plus20_s'] is None else round(figures['to_plus20_s'], 1)} s; "
              f"held-out {figures['curve']}")
    ratio = statistics.median(remote["pauses"]) / statistics.median(local["pauses"])
    print(f"RESULT update_pause_cross_node_over_local {ratio:.2f}")
    if one["to_plus20_s"] and two["to_plus20_s"]:
        print(f"RESULT time_to_plus20_two_nodes_over_one {two['to_plus20_s'] / one['to_plus20_s']:.2f}")
    else:
        print("RESULT time_to_plus20_two_nodes_over_one nan  (a run did not reach +20)")
    print(f"RESULT placement_group_wait_s {two['placement_wait_s']:.2f}")
    print(f"RESULT startup_two_nodes_over_one {two['startup_s'] / one['startup_s']:.2f}")


if __name__ == "__main__":
    main()
