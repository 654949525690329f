"""Async (PipelineRL, in-flight updates) vs sync (generate, then train) on one config.

Runs `python -m rl_core run` twice, side by side in time on the same machine: once with
`mode: async`, once with `mode: sync` (sync_steps_per_batch=1), same model, task, seed,
batch size and step count. Both learn from the same amount of data (max_steps x S
samples), so the comparison is:

- `async_over_sync_wall_time`: wall time until the run's smoothed training reward
  (mean reward of the samples trained at a step, averaged over `--smooth` steps) first
  reaches the target = the lower of the two runs' best smoothed reward, async / sync;
- `async_over_sync_step_time`: wall time from the first to the last optimizer step,
  async / sync (throughput at equal data).

    .venv/bin/python bench/async_vs_sync.py [--steps 12] [--model var/models/tiny]

Ends with `RESULT <name> <value>` lines. About 2 x 4 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rl_core.metrics import read_metrics  # noqa: E402


def bench_config(model: str, steps: int, mode: str) -> dict:
    return {
        "name": f"bench-{mode}",
        "mode": mode,
        "sync_steps_per_batch": 1,
        "seed": 0,
        "model": {"path": model},
        "task": {"heldout_size": 8},
        "sampling": {"temperature": 1.0, "max_new_tokens": 32},
        "inference": {"num_servers": 1, "max_batch_size": 64},
        "actor": {"group_size": 8, "groups_in_flight": 4, "max_lag": 2},
        "trainer": {"samples_per_step": 16, "max_steps": steps, "lr": 2e-4, "warmup_steps": 1},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
    }


def run_mode(model: str, steps: int, mode: str, root: Path) -> list[dict]:
    config_path = root / f"{mode}.yaml"
    config_path.write_text(yaml.safe_dump(bench_config(model, steps, mode)))
    out = root / mode
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "rl_core", "run", str(config_path), "--out", str(out), "--quiet"],
                            cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{mode} run failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    steps_records = [r for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    for record in steps_records:
        record["elapsed"] = record["t"] - started
    return steps_records


def smoothed(values: list[float], window: int) -> list[float]:
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]


def time_to_reach(records: list[dict], target: float, window: int) -> float:
    curve = smoothed([r["train/reward_mean"] for r in records], window)
    for record, value in zip(records, curve):
        if value >= target - 1e-12:
            return record["elapsed"]
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="Optimizer steps per run.")
    parser.add_argument("--model", default=str(REPO / "var" / "models" / "tiny"), help="Model directory.")
    parser.add_argument("--smooth", type=int, default=3, help="Steps in the reward moving average.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-async-sync-") as tmp:
        root = Path(tmp)
        runs = {mode: run_mode(args.model, args.steps, mode, root) for mode in ("async", "sync")}

    best = {mode: max(smoothed([r["train/reward_mean"] for r in records], args.smooth)) for mode, records in runs.items()}
    target = min(best.values())
    print(f"{'mode':6} {'steps':>5} {'first->last step s':>18} {'to target s':>11} {'best reward':>11} {'lag max':>7}")
    row = {}
    for mode, records in runs.items():
        span = records[-1]["elapsed"] - records[0]["elapsed"]
        reach = time_to_reach(records, target, args.smooth)
        lag = max(r["policy_lag/max"] for r in records)
        row[mode] = (span, reach)
        print(f"{mode:6} {len(records):5d} {span:18.1f} {reach:11.1f} {best[mode]:11.3f} {lag:7.0f}")
    print(f"target smoothed training reward: {target:.3f}")
    print(f"RESULT async_over_sync_wall_time {row['async'][1] / row['sync'][1]:.3f}")
    print(f"RESULT async_over_sync_step_time {row['async'][0] / row['sync'][0]:.3f}")


if __name__ == "__main__":
    main()
