"""What crossing machines costs a run, on one machine: each "node" a network namespace of its
own joined by a veth pair (tests/multinode/netns_cluster.py; `--bridge`: through the tests'
bridge instead), so traffic between roles really
crosses interfaces. The cores are the same two either way, so no speed-up can show here; the
figures say what the crossing itself costs.

- `update_pause_cross_node_over_local`: the in-flight update pause of a real reference server
  that keeps decoding while a trainer broadcasts the ~125M model (bench/weight_update.py's
  measurement), the server on another namespace (gloo over eth0 of both) over the same with
  server and trainer in one namespace (gloo over its loopback). Both servers run at once and
  the trainer updates them in turn, so slow phases of the shared machine hit both sides alike;
  the ratio is of the medians. Goal <= 1.3.
- `time_to_plus20_two_nodes_over_one`: the demo (examples/tiny-cpu.yaml) to +20 held-out points,
  from `python -m rl_core run` to the evaluation that reaches it: on a 2-node Ray cluster
  (trainer and actor on node 0, the server on node 1, the stream in the run's Redis) over the
  single-node demo, medians of `--repeats` runs of each, run alternately; each run's time is
  printed beside the medians. The runs have room (`--steps 40`: the demo reaches +20 by step
  15-25), so none ends on the threshold; should one still miss it, the ratio is nan and
  `time_to_common_gain_two_nodes_over_one` says the same at the largest gain every run reached.
  Goal <= 1.15.
- `step_time_two_nodes_over_one`: the same runs' seconds per trainer step (after the first), which
  the held-out curve's 5-step evaluation grid does not quantize.
- `placement_group_wait_s`, and `startup_two_nodes_over_one`: launch to every server ready
  (servers.json written) on the cluster over the same on one node. Each two-node run's line also
  says when every node's Ray actor answered (from the placement group's request): the Ray part
  of its start-up, before which no role starts.
- `--streams 2,3,4`: the pauses with other gloo stream counts too, in the same alternation.

    .venv/bin/python bench/multinode.py [--updates 7] [--steps 40] [--repeats 2] [--pauses-only] [--streams 2,3] [--smoke]

Needs root (ip netns). About 9 minutes on a quiet 2-core CPU. `--smoke` is the smallest real
two-node setting: the tiny model's weights for the pauses (`--model`, read from its
model.safetensors without transformers), one update landing 0.25 s into the decoding, one demo run
of each kind at the demo's smallest settings (benchlib.SMOKE_DEMO_OVERRIDES), the same namespaces
and Ray cluster; what the measurement keeps apart overlaps there (Ray starts while the pauses are
measured, the two demo runs run side by side): its figures prove the bench runs, no more.
The pause servers start side by side in every mode (nothing is measured before both are up).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from benchlib import REPO_ROOT, build_model, demo_config_data, parse_bench_args, tiny_or_given_model  # noqa: F401  (first: it puts the checkout on sys.path)

sys.path.insert(0, str(REPO_ROOT / "tests" / "multinode"))
from netns_cluster import INTERFACE, NetnsCluster, netns_usable  # noqa: E402

from tests.metrics_file import read_metrics  # noqa: E402
from tests.rl_core.server_process import ServerProcess, start_server_process  # noqa: E402
from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR  # noqa: E402
from rl_core.weights.sync import default_streams  # noqa: E402

if TYPE_CHECKING:
    import torch

GAIN = 0.20


# --- the update pause ----------------------------------------------------------------------


def trainer_weights(model_dir: str, smoke: bool) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) list the trainer broadcasts: the model's parameters. --smoke reads a
    single-file checkpoint's tensors straight from model.safetensors (the same names and values,
    tied ones stored once as named_parameters() lists them, in the file's order): importing
    transformers to build the model would be ~5 of the smoke's CPU-seconds, for tensors the
    measured path (WeightBroadcaster to the servers) takes as they are."""
    import torch

    checkpoint = Path(model_dir) / "model.safetensors"
    if smoke and checkpoint.exists():
        from safetensors.torch import load_file

        return [(name, tensor.to(torch.float32)) for name, tensor in load_file(str(checkpoint)).items()]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return [(name, parameter.detach()) for name, parameter in model.named_parameters()]


def pause_worker(local_url: str, remote_url: str, remote_master: str, model_dir: str, updates: int,
                 stream_counts: list[int], smoke: bool) -> None:
    """Run inside node 0's namespace: this process is the trainer. Each round joins a weight group
    with the server on this node (over its loopback), then one with the server on node 1 (over
    the veth), with each of `stream_counts` (the first: what a run uses; `--streams`) and with
    one stream (what more streams buy); in each group one warm-up update, then one measured while that server
    decodes. Going round the sides this way, every side sees the same phases of the shared
    machine's load. Prints the servers' pauses as JSON."""
    import threading

    import torch

    from benchlib import keep_decoding
    from rl_core.weights.sync import DEFAULT_BUCKET_BYTES, WeightBroadcaster

    torch.set_num_threads(1)
    named = trainer_weights(model_dir, smoke)
    # The update lands mid-decode, as in a run: this long after the decoding starts. --smoke: a
    # quarter of it (its first requests are in flight by then), 4 sides x 0.75 s of two busy processes less.
    decode_lead_s = 0.25 if smoke else 1.0
    counts = list(dict.fromkeys([*stream_counts, 1]))
    sides = {f"{where}/{streams}": (url, master, streams) for streams in counts
             for where, url, master in (("local", local_url, "127.0.0.1"), ("remote", remote_url, remote_master))}
    figures: dict[str, dict[str, list[float]]] = {side: {"pauses": [], "broadcasts": []} for side in sides}
    version = 0
    for _ in range(updates):
        for side, (url, master, streams) in sides.items():
            # A server is in one weight group at a time: joining anew replaces its previous one.
            broadcaster = WeightBroadcaster([url], master_address=master, bucket_bytes=DEFAULT_BUCKET_BYTES, streams=streams)
            try:
                broadcaster.connect()
                version += 1
                broadcaster.broadcast(named, version)  # warm-up: the connections' first bytes
                stop = threading.Event()
                decoder = threading.Thread(target=keep_decoding, args=(url, stop), daemon=True)
                decoder.start()
                time.sleep(decode_lead_s)  # the update lands mid-decode, as in a run
                with torch.no_grad():
                    for _, tensor in named:
                        tensor.mul_(1.0001)
                version += 1
                result = broadcaster.broadcast(named, version)
                stop.set()
                decoder.join(120)
            finally:
                broadcaster.close()
            figures[side]["pauses"].append(result["weights/update_pause_s"])
            figures[side]["broadcasts"].append(result["weights/broadcast_s"])
    print(json.dumps(figures), flush=True)


def measure_pauses(cluster: NetnsCluster, model_dir: Path, updates: int, stream_counts: list[int],
                   smoke: bool) -> dict[str, dict[str, list[float]]]:
    """A server on node 0 (reached over its loopback) and one on node 1 (over the veth); the
    trainer on node 0 updates them in turn."""
    trainer, remote = cluster.nodes[0], cluster.nodes[1]
    processes: list[ServerProcess] = []
    try:
        commands = [(node, node.command([sys.executable, "-m", "rl_core", "serve", "--model", str(model_dir), "--host", host,
                                         "--port", "0", "--max-batch-size", "8"]))
                    for node, host in ((trainer, "127.0.0.1"), (remote, remote.address))]
        # Both start at once (each waits seconds for its ready line, idle between imports on two cores);
        # nothing is measured before both are up.
        with ThreadPoolExecutor(len(commands)) as pool:
            futures = [pool.submit(start_server_process, command, timeout_s=300, env=cluster.env(), what=f"server on {node.netns}")
                       for node, command in commands]
        processes += [future.result() for future in futures if future.exception() is None]  # stopped below, whatever failed
        for future in futures:
            future.result()  # a server that did not start: its error
        result = subprocess.run(trainer.command([sys.executable, str(Path(__file__).resolve()), "--pause-worker", processes[0].url,
                                                 "--remote-url", processes[1].url, "--remote-master", trainer.address,
                                                 "--model-dir", str(model_dir), "--updates", str(updates),
                                                 "--streams", ",".join(map(str, stream_counts))] + (["--smoke"] if smoke else [])),
                                env=cluster.env(), capture_output=True, text=True, timeout=1800, cwd=REPO_ROOT)
        if result.returncode != 0:
            raise SystemExit(f"pause worker failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        for process in processes:
            process.stop()


# --- the demo on one node and on two -----------------------------------------------------------


def demo_config(scratch: Path, steps: int, cluster: NetnsCluster | None, smoke: bool) -> Path:
    config = demo_config_data(smoke)  # --smoke: the demo at its smallest settings
    config["trainer"].update(max_steps=steps, checkpoint_every=0)
    if cluster is not None:
        config["stream"] = {"kind": "redis", "redis_embedded": True}
        config["cluster"] = {"enabled": True, "nodes": 2, "ray_address": cluster.address, "placement_timeout_s": 120,
                             "network_interface": INTERFACE}
    path = scratch / ("two-nodes.yaml" if cluster else "one-node.yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def run_demo(config: Path, out: Path, cluster: NetnsCluster | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"]
    command = cluster.head.command(argv) if cluster else argv
    env = cluster.env() if cluster else dict(os.environ)
    launched = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=1200)
    if result.returncode != 0:
        raise SystemExit(f"{config.name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    records = read_metrics(out / "metrics.jsonl")
    heldout = [(r["step"], r["t"], r["success/heldout"]) for r in records if "success/heldout" in r]
    reached = first_reaching(heldout, GAIN)
    wait = re.search(r"placement group ready after ([0-9.]+) s", result.stdout)
    actors = re.search(r"every node's Ray actor up after ([0-9.]+) s", result.stdout)
    # The trainer's steps after the first (which waits for the first batch): seconds per step.
    steps = sorted((r["step"], r["t"]) for r in records if "success/mean" in r)
    per_step = (steps[-1][1] - steps[1][1]) / (steps[-1][0] - steps[1][0]) if len(steps) > 2 else None
    return {
        "launched": launched,
        "heldout": heldout,
        "to_plus20_s": None if reached is None else reached[1] - launched,
        "step": None if reached is None else reached[0],
        "startup_s": (out / "servers.json").stat().st_mtime - launched,
        "placement_wait_s": float(wait.group(1)) if wait else None,
        "actors_wait_s": float(actors.group(1)) if actors else None,
        "per_step_s": per_step,
        "curve": " ".join(f"{step}:{value:.2f}" for step, _, value in heldout),  # type: ignore[dict-item]
    }


def first_reaching(heldout: list[tuple[int, float, float]], gain: float) -> tuple[int, float] | None:
    """(step, time) of the first held-out point at least `gain` above the step-0 one, or None."""
    target = heldout[0][2] + gain - 1e-12
    return next(((step, t) for step, t, value in heldout if value >= target), None)


def report_time_to_gain(ones: list[dict], twos: list[dict]) -> None:
    """Each run's seconds to +GAIN beside the medians, and the ratio of the medians; should a run
    miss +GAIN, the same at the largest gain every run reached (a target all of them have)."""
    runs = ones + twos
    common_gain = min(GAIN, *(max(v for _, _, v in run["heldout"]) - run["heldout"][0][2] for run in runs))
    for label, gain in ((f"+{GAIN:.2f}", GAIN), (f"+{common_gain:.3f} (the largest gain every run reached)", common_gain)):
        seconds = {}
        for name, group in (("one node", ones), ("two nodes", twos)):
            reached = [first_reaching(run["heldout"], gain) if gain > 0 else None for run in group]
            seconds[name] = [None if r is None else r[1] - run["launched"] for r, run in zip(reached, group)]
            figures = ", ".join("not reached" if s is None else f"{s:.1f} s (step {r[0]})" for s, r in zip(seconds[name], reached))
            done = [s for s in seconds[name] if s is not None]
            median = f"{statistics.median(done):.1f} s" if len(done) == len(group) else "n/a"
            print(f"  time to {label}, {name}: {figures}; median {median}")
        complete = all(s is not None for values in seconds.values() for s in values)
        ratio = statistics.median(seconds["two nodes"]) / statistics.median(seconds["one node"]) if complete else float("nan")
        name = "time_to_plus20_two_nodes_over_one" if gain == GAIN else "time_to_common_gain_two_nodes_over_one"
        print(f"RESULT {name} {ratio:.2f}")
        if gain == GAIN and complete:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=7, help="Updates of each server (they alternate).")
    parser.add_argument("--steps", type=int, default=40, help="trainer.max_steps of each demo run (room past +20: see the docstring).")
    parser.add_argument("--model", default=None, help="Model whose weights the pauses move (default: a fresh ~125M one; --smoke: the tiny model).")
    parser.add_argument("--repeats", type=int, default=2, help="Demo runs of each kind (medians are compared).")
    parser.add_argument("--pauses-only", action="store_true", help="Measure the update pauses only (no demo runs).")
    parser.add_argument("--streams", default=None,
                        help="Gloo stream counts to measure, comma-separated (default: the default count, "
                             "inference.weight_sync_streams unset); the RESULT lines are the first's, one line more per other.")
    parser.add_argument("--bridge", action="store_true", help="Join the nodes through a bridge (as the tests do), not a veth pair.")
    parser.add_argument("--pause-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--remote-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--remote-master", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parse_bench_args(parser, smoke={"updates": 1, "steps": 4, "repeats": 1, "model": str(REPO_ROOT / DEFAULT_TINY_MODEL_DIR)})
    stream_counts = [int(n) for n in args.streams.split(",")] if args.streams else [default_streams("gloo")]
    if args.pause_worker:
        pause_worker(args.pause_worker, args.remote_url, args.remote_master, args.model_dir, args.updates, stream_counts, args.smoke)
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
            if args.model:
                model_dir = tiny_or_given_model(args.model)
            else:
                model_dir = scratch / "model-125m"
                build_model(model_dir)
            ones: list[dict] = []
            twos: list[dict] = []
            if args.smoke and not args.pauses_only:
                # --smoke overlaps what the measurement keeps apart (its figures prove the bench runs,
                # they are not measurements): Ray starts (~12 s, mostly waiting) while the pauses are
                # measured, and the two demo runs run side by side, not one after the other.
                with ThreadPoolExecutor(2) as pool:
                    ray = pool.submit(cluster.start_ray, cpus_per_node=3)
                    pauses = measure_pauses(cluster, model_dir, args.updates, stream_counts, args.smoke)
                    ray.result()
                    for repeat in range(args.repeats):
                        one = pool.submit(run_demo, demo_config(scratch, args.steps, None, args.smoke), scratch / f"one-{repeat}", None)
                        two = pool.submit(run_demo, demo_config(scratch, args.steps, cluster, args.smoke), scratch / f"two-{repeat}", cluster)
                        ones.append(one.result())
                        twos.append(two.result())
            else:
                pauses = measure_pauses(cluster, model_dir, args.updates, stream_counts, args.smoke)
                if not args.pauses_only:
                    # Ray runs from here on (idle, it takes ~0.03 of a core: RESULTS.md); the demos
                    # alternate one node, two nodes, ... so a drift in the machine's load hits both.
                    cluster.start_ray(cpus_per_node=3)
                    for repeat in range(args.repeats):
                        ones.append(run_demo(demo_config(scratch, args.steps, None, args.smoke), scratch / f"one-{repeat}", None))
                        twos.append(run_demo(demo_config(scratch, args.steps, cluster, args.smoke), scratch / f"two-{repeat}", cluster))
    finally:
        cluster.close()

    streams = stream_counts[0]
    print(f"{model_dir.name} model, gloo, {args.updates} updates of each server while it decodes, alternating local/remote; "
          "server pause s (trainer broadcast s):")
    for side, figures in pauses.items():
        where, count = side.split("/")
        name = f"{'same node (loopback)' if where == 'local' else 'other node (veth)'}, {count} stream{'s' if count != '1' else ''}"
        pairs = " ".join(f"{p:.3f} ({b:.3f})" for p, b in zip(figures["pauses"], figures["broadcasts"]))
        print(f"  {name:32} {pairs}")

    def median_ratio(key: str, count: int) -> float:
        return statistics.median(pauses[f"remote/{count}"][key]) / statistics.median(pauses[f"local/{count}"][key])

    print(f"RESULT update_pause_cross_node_over_local {median_ratio('pauses', streams):.2f}")
    print(f"RESULT broadcast_cross_node_over_local {median_ratio('broadcasts', streams):.2f}")
    print(f"RESULT update_pause_cross_node_over_local_one_stream {median_ratio('pauses', 1):.2f}")
    print(f"RESULT update_pause_cross_node_one_stream_over_default "
          f"{statistics.median(pauses['remote/1']['pauses']) / statistics.median(pauses[f'remote/{streams}']['pauses']):.2f}")
    for count in stream_counts[1:]:
        # Other counts against the first's own sides: the same phases of the machine's load.
        print(f"RESULT update_pause_cross_node_over_local_{count}_streams {median_ratio('pauses', count):.2f}")
        for where, label in (("local", "local"), ("remote", "cross_node")):
            ratio = statistics.median(pauses[f"{where}/{count}"]["pauses"]) / statistics.median(pauses[f"{where}/{streams}"]["pauses"])
            print(f"RESULT update_pause_{label}_{count}_streams_over_{streams} {ratio:.2f}")
    if not ones:
        return
    print(f"demo to +{GAIN:.2f} held-out ({args.steps} steps at most), runs in the order they ran:")
    for one, two in zip(ones, twos):
        for name, figures in (("one node", one), ("two nodes", two)):
            reached = figures["to_plus20_s"]
            ray_part = (f" (placement group {figures['placement_wait_s']:.1f} s, every node's Ray actor up after "
                        f"{figures['actors_wait_s']:.1f} s)") if figures["actors_wait_s"] is not None else ""
            per_step = "n/a" if figures["per_step_s"] is None else f"{figures['per_step_s']:.2f}"  # a run too short for two steps' gap
            print(f"  {name:10} start-up {figures['startup_s']:.1f} s{ray_part}, {per_step} s/step, +20 at step "
                  f"{figures['step']} after {reached if reached is None else round(reached, 1)} s; held-out {figures['curve']}")

    def median_of(runs: list[dict], key: str) -> float | None:
        values = [run[key] for run in runs if run[key] is not None]
        return statistics.median(values) if len(values) == len(runs) else None

    report_time_to_gain(ones, twos)
    def ratio(key: str) -> float:
        two, one = median_of(twos, key), median_of(ones, key)
        return math.nan if two is None or one is None else two / one  # nan: some run had no figure (said above)

    placement = median_of(twos, "placement_wait_s")
    print(f"RESULT step_time_two_nodes_over_one {ratio('per_step_s'):.2f}")
    print(f"RESULT placement_group_wait_s {math.nan if placement is None else placement:.2f}")
    print(f"RESULT startup_two_nodes_over_one {ratio('startup_s'):.2f}")

if __name__ == "__main__":
    main()
