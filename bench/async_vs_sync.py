"""Async (PipelineRL, in-flight updates) vs sync (generate, then train) on one config.

Runs `python -m rl_core run` on the demo config (examples/tiny-cpu.yaml) twice, one
after the other on the same machine: once with `mode: async`, once with `mode: sync`
(sync_steps_per_batch=1), same model, task, seed, batch size and step count. Both
evaluate the held-out set at the same steps, so the comparison is:

- `async_over_sync_wall_time`: wall time from the start of the run until held-out
  success first reaches the target (the step-0 success + `--gain`), async / sync;
- `async_over_sync_step_time`: wall time from the first to the last optimizer step,
  async / sync (throughput at equal data).
- `async_over_sync_wall_time_after_startup`: the same as the first, with each run's clock
  started at its first metrics line (servers up, trainer and actor loading: the time zero of
  bench/vs_trl.py), so the ~3.5 s of process start-up both modes share is left out.
- `async_over_sync_wall_time_perfect_overlap`: what the first ratio would be if async overlapped
  generation and training perfectly, from the sync run's own parts: its time before the first
  optimizer step (start-up, the step-0 evaluation, the first batch: async waits for them too),
  half its time from the first step to the target step (one server and one trainer on two cores:
  an async step is at least max(G, T) >= (G + T) / 2 of a sync step's G + T), and the target
  step's evaluation. A measured ratio near it means the pipeline is not what is left.

    .venv/bin/python bench/async_vs_sync.py [--steps 40] [--gain 0.15] [--model var/models/tiny] [--smoke]

Ends with `RESULT <name> <value>` lines. About 2 x 4 minutes on a quiet 2-core CPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from benchlib import REPO_ROOT as REPO  # noqa: E402  (first: it puts the checkout on sys.path)
from benchlib import demo_config_data, parse_bench_args, run_cli  # noqa: E402


def bench_config(model: str, steps: int, mode: str, smoke: bool) -> dict:
    config = demo_config_data(smoke)  # --smoke: the demo at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES)
    config.update({"name": f"bench-{mode}", "mode": mode, "sync_steps_per_batch": 1, "max_wall_time_s": 600})
    config["model"]["path"] = model
    config["trainer"].update({"max_steps": steps, "checkpoint_every": 0})
    return config


def run_mode(model: str, steps: int, mode: str, root: Path, smoke: bool) -> list[dict]:
    config_path = root / f"{mode}.yaml"
    config_path.write_text(yaml.safe_dump(bench_config(model, steps, mode, smoke)))
    started = time.time()
    records = run_cli(config_path, root / mode)
    for record in records:
        record["elapsed"] = record["t"] - started
        record["after_startup"] = record["t"] - records[0]["t"]
    return records


def time_to_reach(records: list[dict], target: float, clock: str = "elapsed") -> float:
    for record in records:
        if record.get("success/heldout", -1.0) >= target - 1e-12:
            return record[clock]
    return float("nan")


def perfect_overlap(sync_records: list[dict], target: float) -> tuple[float, str]:
    """The wall-time ratio a perfect async pipeline would reach against this sync run, and the
    sync run's parts it is made of (the module docstring says why); nan when sync missed the target."""
    reached = next((r for r in sync_records if r.get("success/heldout", -1.0) >= target - 1e-12), None)
    steps = {r["step"]: r["elapsed"] for r in sync_records if "train/loss" in r}
    if reached is None or reached["step"] not in steps:
        return float("nan"), "sync parts: the target was not reached"
    before_first_step = min(steps.values())
    stepping = steps[reached["step"]] - before_first_step
    evaluating = reached["elapsed"] - steps[reached["step"]]
    parts = (f"sync parts: {before_first_step:.1f} s before step 1 (start-up {sync_records[0]['elapsed']:.1f} s), "
             f"{stepping:.1f} s from step 1 to step {reached['step']}, {evaluating:.1f} s for its evaluation")
    return (before_first_step + stepping / 2 + evaluating) / reached["elapsed"], parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="Optimizer steps per run.")
    parser.add_argument("--model", default=str(REPO / "var" / "models" / "tiny"), help="Model directory.")
    parser.add_argument("--gain", type=float, default=0.15, help="Target: step-0 held-out success plus this.")
    args = parse_bench_args(parser, smoke={"steps": 4})

    with tempfile.TemporaryDirectory(prefix="bench-async-sync-") as tmp:
        root = Path(tmp)
        runs = {mode: run_mode(args.model, args.steps, mode, root, args.smoke) for mode in ("async", "sync")}

    heldout = {mode: [r for r in records if "success/heldout" in r] for mode, records in runs.items()}
    start = heldout["async"][0]["success/heldout"]
    target = start + args.gain
    print(f"{'mode':6} {'steps':>5} {'first->last step s':>18} {'to target s':>11} {'after start-up':>14} {'held-out by step':<60}")
    row = {}
    for mode, records in runs.items():
        steps = [r for r in records if "train/loss" in r]
        span = steps[-1]["elapsed"] - steps[0]["elapsed"]
        reach = time_to_reach(records, target)
        lag = max(r["policy_lag/max"] for r in steps)
        curve = " ".join(f"{r['step']}:{r['success/heldout']:.2f}" for r in heldout[mode])
        row[mode] = (span, reach, time_to_reach(records, target, "after_startup"))
        print(f"{mode:6} {len(steps):5d} {span:18.1f} {reach:11.1f} {row[mode][2]:14.1f} {curve}  (lag max {lag:.0f})")
    print(f"target held-out success: {target:.3f} (step 0: {start:.3f} + {args.gain})")
    perfect, parts = perfect_overlap(runs["sync"], target)
    print(parts)
    print(f"RESULT async_over_sync_wall_time {row['async'][1] / row['sync'][1]:.3f}")
    print(f"RESULT async_over_sync_step_time {row['async'][0] / row['sync'][0]:.3f}")
    print(f"RESULT async_over_sync_wall_time_after_startup {row['async'][2] / row['sync'][2]:.3f}")
    print(f"RESULT async_over_sync_wall_time_perfect_overlap {perfect:.3f}")


if __name__ == "__main__":
    main()
