"""Is the default demo's run a healthy one? Alerts fired and the held-out curve, over N seeds.

Runs the demo as a newcomer does (`python -m rl_core run examples/tiny-cpu.yaml --out DIR`,
one run after the other, seeds 0..N-1) and, for each run directory:

- replays the platform's built-in alert rules on what the run wrote, offline, with the
  platform's own pure rules (`inflight.alerts.rules`, no database): every metrics.jsonl line
  through `check_line` in line order, a gap of `stall_s` or more between metrics lines through
  `check_stall` (what the worker's polls see), each evals.jsonl line through `check_eval`
  against the best earlier step of its benchmark; an alert counts once per episode
  (`advance_episodes`, as `inflight.alerts.services` stores them).
  tests/platform/test_demo_alerts.py checks the entropy rule itself on the real services;
- reads the held-out curve (`success/heldout` by step) and its final value over its best.

    .venv/bin/python bench/demo_health.py [--runs 2] [--parallel] [--config examples/tiny-cpu.yaml] [--set k=v ...] [--smoke]
    .venv/bin/python bench/demo_health.py --replay DIR [DIR ...]     # existing run directories

Judge learning by step, not seconds: on a shared machine the wall clock says little. Ends with
`RESULT demo_alerts_fired <n>` (all runs together), `RESULT demo_final_over_best_heldout <ratio>`
(mean over runs of the last held-out point over the run's best), `RESULT
demo_steps_to_plus20_heldout <step>` (median) and the curve, one column per run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import REPO_ROOT, SMOKE_DEMO_OVERRIDES, parse_bench_args, run_cli  # noqa: E402  (first: it puts the checkout and platform/ on sys.path)

from inflight.alerts.rules import Verdicts, advance_episodes, check_eval, check_line, check_stall  # noqa: E402  (pure: no Django, no database)
from rl_core.rundir.layout import EVALS_FILE, METRICS_FILE, load_run_config  # noqa: E402
from tests.metrics_file import read_metrics  # noqa: E402

HELDOUT = "success/heldout"
GAIN = 0.20  # the demo's promise, and bench/vs_trl.py's target: +20 points of held-out success


@dataclass
class FiredAlert:
    rule: str
    key: str
    step: int | None
    message: str


@dataclass
class Episodes:
    """The alerts one run's episodes start, in order (`advance_episodes` without the database)."""

    active: set[tuple[str, str]] = field(default_factory=set)
    fired: list[FiredAlert] = field(default_factory=list)

    def apply(self, verdicts: Verdicts, step: int | None) -> None:
        started, _ = advance_episodes(self.active, verdicts)
        self.fired += [FiredAlert(rule, key, step, verdicts.firing[(rule, key)].message) for rule, key in started]


def _step(record: dict[str, Any]) -> int | None:
    value = record.get("step")
    return int(value) if isinstance(value, (int, float)) else None


def read_evals(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / EVALS_FILE
    return read_metrics(path) if path.is_file() else []


def replay_alerts(run_dir: Path) -> list[FiredAlert]:
    """The alerts the platform would store for this run directory, in the order it would."""
    config = load_run_config(run_dir)
    cfg, max_lag = config.monitoring.alerts, config.actor.max_lag
    if not cfg.enabled:
        return []
    episodes = Episodes()
    windows: dict[str, Any] = {}
    records = read_metrics(run_dir / METRICS_FILE)
    last_t: float | None = None
    for record in records:
        episodes.apply(check_line(record, cfg, max_lag, windows), _step(record))
        t = record.get("t")
        if isinstance(t, (int, float)):
            idle_s = t - last_t if last_t is not None else 0.0
            episodes.apply(check_stall(idle_s, True, cfg), _step(record))
            last_t = t
    by_step: dict[str, list[tuple[int, float]]] = {}
    for line in read_evals(run_dir):
        benchmark, step, score = str(line["benchmark"]), int(line["step"]), float(line["mean_at_k"])
        best_earlier = max((value for s, value in by_step.get(benchmark, []) if s < step), default=None)
        episodes.apply(check_eval(benchmark, step, int(line.get("k", 1)), score, best_earlier, cfg), step)
        by_step.setdefault(benchmark, []).append((step, score))
    return episodes.fired


def heldout_curve(run_dir: Path) -> dict[int, float]:
    """success/heldout by the step its evaluation started at (the last line per step wins)."""
    curve: dict[int, float] = {}
    for record in read_metrics(run_dir / METRICS_FILE):
        if isinstance(record.get(HELDOUT), (int, float)) and _step(record) is not None:
            curve[_step(record)] = float(record[HELDOUT])
    return dict(sorted(curve.items()))


def entropy_by_step(run_dir: Path) -> dict[int, float]:
    return {
        _step(r): float(r["train/entropy"]) for r in read_metrics(run_dir / METRICS_FILE)
        if isinstance(r.get("train/entropy"), (int, float)) and _step(r) is not None
    }


@dataclass
class RunHealth:
    run_dir: Path
    alerts: list[FiredAlert]
    curve: dict[int, float]
    entropy: dict[int, float]
    wall_s: float | None = None

    @property
    def final_over_best(self) -> float:
        values = list(self.curve.values())
        return values[-1] / max(values) if values and max(values) > 0 else float("nan")

    @property
    def step_to_gain(self) -> int | None:
        if not self.curve:
            return None
        start = self.curve[min(self.curve)]
        return next((step for step, value in self.curve.items() if value >= start + GAIN - 1e-9), None)


def measure(run_dir: Path, wall_s: float | None = None) -> RunHealth:
    return RunHealth(run_dir, replay_alerts(run_dir), heldout_curve(run_dir), entropy_by_step(run_dir), wall_s)


def report(runs: list[RunHealth]) -> None:
    for index, run in enumerate(runs):
        entropy = list(run.entropy.values())
        window = 10  # AlertsConfig.entropy_window's default
        means = [sum(entropy[i - window:i]) / window for i in range(window, len(entropy) + 1)]
        ent = (f"entropy first {entropy[0]:.3f} min {min(entropy):.4f} (min of {window}-step means "
               f"{min(means, default=float('nan')):.4f}) last {entropy[-1]:.4f}") if entropy else "no entropy"
        wall = f", {run.wall_s:.0f} s" if run.wall_s is not None else ""
        print(f"[run {index}] {run.run_dir}{wall}: {len(run.alerts)} alerts, final/best held-out {run.final_over_best:.3f}, "
              f"+{GAIN:.2f} at step {run.step_to_gain}, {ent}")
        for alert in run.alerts:
            print(f"    alert {alert.rule}{'/' + alert.key if alert.key else ''} at step {alert.step}: {alert.message}")
    steps = sorted({step for run in runs for step in run.curve})
    print("\nheld-out success by step (one column per run, then the mean):")
    print("step  " + "  ".join(f"run{i:<2}" for i in range(len(runs))) + "   mean")
    for step in steps:
        values = [run.curve.get(step) for run in runs]
        present = [v for v in values if v is not None]
        cells = "  ".join(f"{v:5.3f}" if v is not None else "  -  " for v in values)
        print(f"{step:4d}  {cells}  {statistics.mean(present):5.3f}")
    fired = sum(len(run.alerts) for run in runs)
    ratios = [run.final_over_best for run in runs]
    to_gain = [run.step_to_gain for run in runs if run.step_to_gain is not None]
    print(f"\nRESULT demo_alerts_fired {fired}")
    print(f"RESULT demo_final_over_best_heldout {statistics.mean(ratios):.3f}")
    print(f"RESULT demo_final_over_best_heldout_min {min(ratios):.3f}")
    print(f"RESULT demo_steps_to_plus20_heldout {statistics.median(to_gain) if to_gain else 'never'}")


def run_seeds(args: argparse.Namespace) -> list[RunHealth]:
    """The demo once per seed, one after the other, or all at once with --parallel (each run's
    steps then take longer, which changes nothing judged by step)."""
    outs = [Path(args.out_root) / f"seed{args.seed_start + index}" for index in range(args.runs)]
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    overrides = [[f"seed={args.seed_start + index}", *args.set] for index in range(args.runs)]
    started = time.monotonic()
    if args.parallel:
        with ThreadPoolExecutor(max_workers=args.runs) as pool:
            list(pool.map(lambda item: run_cli(args.config, item[0], item[1]), zip(outs, overrides)))
        walls = [time.monotonic() - started] * args.runs
    else:
        walls = []
        for out, items in zip(outs, overrides):
            run_cli(args.config, out, items)
            walls.append(time.monotonic() - started - sum(walls))
    runs = [measure(out, wall) for out, wall in zip(outs, walls)]
    for out, run in zip(outs, runs):
        print(f"{out.name}: {run.wall_s:.0f} s, {len(run.alerts)} alerts, curve "
              + json.dumps({str(k): round(v, 3) for k, v in run.curve.items()}), flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="examples/tiny-cpu.yaml")
    parser.add_argument("--runs", type=int, default=2, help="Runs, seeds seed-start, seed-start+1, ...")
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--parallel", action="store_true", help="Start every seed's run at once.")
    parser.add_argument("--set", action="append", default=[], help="Extra --set k=v for every run.")
    parser.add_argument("--out-root", default=str(REPO_ROOT / "var" / "bench-demo-health"))
    parser.add_argument("--replay", nargs="+", default=None, help="Measure these run directories instead of running.")
    # --smoke: one run of the demo at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES).
    args = parse_bench_args(parser, smoke={"runs": 1, "set": list(SMOKE_DEMO_OVERRIDES)})
    if args.replay:
        report([measure(Path(path)) for path in args.replay])
        return
    runs = run_seeds(args)
    report(runs)


if __name__ == "__main__":
    main()
