"""Learning with all accelerations on vs all off: success-rate curves and wall times of two tiny runs.

Runs `python -m rl_core run CONFIG` twice, one after the other, with the same seed and budget:

- off: `accelerations.{histospec,histopipe,tail_batching}.enabled=false`
- on:  all three `true`

and prints both `success/heldout` curves (the held-out success rate the actor measures every
`eval.heldout_every_n_steps`) side by side, the rollout `success/mean` per step range, the
HistoSpec figures the servers report, and each run's wall time. The accelerations must not
change what is learned (HistoSpec is lossless; the schedulers only reorder/route work), only
how fast; a curve that drops with them on is a bug.

    .venv/bin/python bench/accelerations_learning.py          # 2 runs x ~4 min on the 2-core CPU sandbox (--smoke: seconds)

Ends with `RESULT accel_on_heldout_final`, `RESULT accel_off_heldout_final`,
`RESULT accel_on_wall_s`, `RESULT accel_off_wall_s`, `RESULT accel_steps_per_s_ratio` (on / off).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchlib import REPO_ROOT, SMOKE_DEMO_OVERRIDES, parse_bench_args  # noqa: E402  (first: it puts the checkout on sys.path)

from rl_core.rundir.layout import read_status  # noqa: E402

SWITCHES = ("histospec", "histopipe", "tail_batching")


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a torn last line
    return rows


def run_once(label: str, enabled: bool, args: argparse.Namespace) -> dict:
    out = Path(args.out_root) / label
    if out.exists():
        shutil.rmtree(out)
    overrides = [f"accelerations.{name}.enabled={'true' if enabled else 'false'}" for name in SWITCHES]
    overrides += [f"trainer.max_steps={args.steps}", f"max_wall_time_s={args.wall}", f"seed={args.seed}"]
    overrides += list(args.set)
    command = [sys.executable, "-m", "rl_core", "run", args.config, "--out", str(out), "--quiet"]
    for item in overrides:
        command += ["--set", item]
    print(f"[{label}] {' '.join(command[1:])}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    record = read_status(out)
    status = record.model_dump() if record is not None else {}
    if completed.returncode != 0:
        print(f"[{label}] exit {completed.returncode}: {completed.stderr[-2000:]}", flush=True)
    metrics = read_jsonl(out / "metrics.jsonl")
    return {"label": label, "wall_s": wall, "rc": completed.returncode, "status": status, "metrics": metrics}


def heldout_curve(metrics: list[dict]) -> dict[int, float]:
    return {int(row["step"]): float(row["success/heldout"]) for row in metrics if "success/heldout" in row}


def rollout_success_by_bucket(metrics: list[dict], bucket: int) -> dict[int, float]:
    sums: dict[int, list[float]] = {}
    for row in metrics:
        if "success/mean" in row:
            sums.setdefault(int(row["step"]) // bucket * bucket, []).append(float(row["success/mean"]))
    return {step: sum(values) / len(values) for step, values in sorted(sums.items())}


def mean_value(metrics: list[dict], key: str) -> float | None:
    # Zero readings are the idle windows at start-up and shutdown, not throughput.
    values = [float(row[key]) for row in metrics if key in row and float(row[key]) > 0]
    return sum(values) / len(values) if values else None


def steps_per_s(metrics: list[dict]) -> float:
    """Trainer steps per second between the first and the last trainer step logged."""
    points = [(float(row["t"]), int(row["step"])) for row in metrics if "step" in row and "t" in row]
    if not points:
        return 0.0
    started = min(t for t, _ in points)
    last_t, last_step = max(points, key=lambda point: (point[1], point[0]))
    return last_step / (last_t - started) if last_t > started else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/tiny-cpu.yaml", help="Run config both runs start from.")
    parser.add_argument("--steps", type=int, default=40, help="trainer.max_steps of each run.")
    parser.add_argument("--wall", type=float, default=300, help="max_wall_time_s of each run.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-root", default=str(REPO_ROOT / "var" / "bench" / "accelerations"), help="Run dirs go here.")
    parser.add_argument("--set", action="append", default=[], help="Extra override for both runs (key=value).")
    # --smoke: the demo at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES) for both runs.
    args = parse_bench_args(parser, {"steps": 4, "wall": 120, "set": list(SMOKE_DEMO_OVERRIDES)}, argv)

    results = [run_once("off", False, args), run_once("on", True, args)]
    off, on = results
    curves = {r["label"]: heldout_curve(r["metrics"]) for r in results}
    steps = sorted(set(curves["off"]) | set(curves["on"]))

    print(f"\nAccelerations on vs off: {args.config}, max_steps={args.steps}, max_wall_time_s={args.wall}, seed={args.seed}")
    import rl_core.actor.loop

    if "tail_batching" not in inspect.getsource(rl_core.actor.loop):
        print("note: the actor does not read accelerations.tail_batching yet, so 'on' runs HistoSpec + HistoPipe only")
    print(f"{'step':>6}{'heldout off':>13}{'heldout on':>12}")
    for step in steps:
        cells = [f"{curves[name][step]:>12.3f}" if step in curves[name] else f"{'-':>12}" for name in ("off", "on")]
        print(f"{step:>6} {cells[0]}{cells[1]}")
    bucket = max(1, args.steps // 8)
    rollout = {r["label"]: rollout_success_by_bucket(r["metrics"], bucket) for r in results}
    print(f"\nrollout success/mean by {bucket}-step bucket")
    print(f"{'steps':>9}{'off':>8}{'on':>8}")
    for step in sorted(set(rollout["off"]) | set(rollout["on"])):
        cells = [f"{rollout[name][step]:>8.3f}" if step in rollout[name] else f"{'-':>8}" for name in ("off", "on")]
        print(f"{step:>4}-{step + bucket - 1:<4}{cells[0]}{cells[1]}")
    print(f"\n{'run':<5}{'state':>11}{'wall s':>9}{'last step':>11}{'steps/s':>9}{'spec accept':>13}{'tokens/s':>10}")
    for r in results:
        last_step = max((int(row.get("step", 0)) for row in r["metrics"]), default=0)
        r["steps_per_s"] = steps_per_s(r["metrics"])
        accept = mean_value(r["metrics"], "spec/acceptance_rate")
        tokens = mean_value(r["metrics"], "rollout/tokens_per_s")
        print(
            f"{r['label']:<5}{r['status'].get('state', '?'):>11}{r['wall_s']:>9.1f}{last_step:>11}{r['steps_per_s']:>9.3f}"
            f"{(f'{accept:.2f}' if accept is not None else '-'):>13}{(f'{tokens:.0f}' if tokens is not None else '-'):>10}"
        )
    print("(wall s includes start-up and the final evaluation; a run that hits max_wall_time_s stops early, so"
          " compare steps/s.)")
    final = {name: curves[name][max(curves[name])] if curves[name] else float("nan") for name in ("off", "on")}
    print(f"RESULT accel_off_heldout_final {final['off']:.3f}")
    print(f"RESULT accel_on_heldout_final {final['on']:.3f}")
    print(f"RESULT accel_off_wall_s {off['wall_s']:.1f}")
    print(f"RESULT accel_on_wall_s {on['wall_s']:.1f}")
    ratio = on["steps_per_s"] / off["steps_per_s"] if off["steps_per_s"] else float("nan")
    print(f"RESULT accel_steps_per_s_ratio {ratio:.3f}")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
