"""How far the create page's lag prediction (`rl_core/actor/lag_prediction.py`) is from the lag a
run measures: each config is predicted from the config alone (the default `LagAssumptions`), run
for real on the tiny model (`python -m rl_core run`), and compared with its `policy_lag/*` lines.

Also fits the speeds the prediction assumes to what the run's timeline recorded (decode spans:
seconds per step against sequences running; the trainer's forward/backward + optimizer against
completion tokens) and predicts again with them, so the error of the model itself is told apart
from the error of the assumed speeds.

    .venv/bin/python bench/lag_prediction.py [--steps 30] [--configs demo,wide,two_servers]

RESULT lines per config: `lag_pred_mean_<c>`, `lag_measured_mean_<c>`, `lag_abs_error_<c>` (mean lag,
versions), `lag_share_tv_<c>` (total variation between the predicted and measured shares: half
the sum of absolute differences, 0 = same, 1 = disjoint), the same with `_fitted`, and
`lag_measured_past_max_<c>` (train/dropped_stale over consumed) with `lag_pred_unbounded_past_max_<c>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DEMO_CONFIG, SMOKE_DEMO_OVERRIDES, parse_bench_args, run_cli  # noqa: E402

from rl_core.actor.lag_prediction import LAG_BINS, LagAssumptions, predict_lag  # noqa: E402
from rl_core.config.files import load_config  # noqa: E402
from rl_core.rundir.timeline import lane_files, read_lane  # noqa: E402
from tests.metrics_file import read_metrics  # noqa: E402

CONFIGS: dict[str, list[str]] = {
    "demo": [],  # examples/tiny-cpu.yaml as it is (64 samples/step, 8 groups of 8 in flight, max_lag 2)
    "wide": ["actor.groups_in_flight=16", "actor.max_lag=4", "trainer.samples_per_step=32"],
    "two_servers": ["inference.num_servers=2", "actor.max_lag=1", "actor.group_size=4", "trainer.samples_per_step=32"],
}
SHARE_KEYS = [f"policy_lag/share/{k}{'+' if k == LAG_BINS - 1 else ''}" for k in range(LAG_BINS)]


def measured(records: list[dict]) -> tuple[list[float], float, float]:
    """Mean over steps of the per-step shares and mean lag; dropped stale over consumed."""
    steps = [r for r in records if "policy_lag/mean" in r]
    shares = [sum(r.get(key, 0.0) for r in steps) / len(steps) for key in SHARE_KEYS]
    mean = sum(r["policy_lag/mean"] for r in steps) / len(steps)
    last = steps[-1]
    past = last.get("train/dropped_stale", 0.0) / max(1.0, last.get("train/samples_consumed", 1.0))
    return shares, mean, past


def fitted_speeds(run_dir: Path, base: LagAssumptions, records: list[dict], max_new_tokens: int,
                  samples_per_step: int) -> LagAssumptions:
    """The assumptions refitted to what this run's timeline and metrics recorded."""
    decode = []  # (seconds per step, most running)
    phases: dict[str, list[float]] = {"forward_backward": [], "optimizer": [], "broadcast": []}
    for path in lane_files(run_dir):
        spans, _ = read_lane(path)
        for span in spans:
            if span["kind"] == "decode" and span.get("count"):
                decode.append(((span["end"] - span["start"]) / span["count"], span.get("running", 1)))
            elif span["kind"] in phases and span["lane"] == "trainer":
                phases[span["kind"]].append(span["end"] - span["start"])
    # Least squares of step seconds = base + per_seq x running.
    n = len(decode)
    if not n:
        return base  # no decode span recorded: nothing to fit
    mx = sum(r for _, r in decode) / n
    my = sum(s for s, _ in decode) / n
    var = sum((r - mx) ** 2 for _, r in decode) or 1.0
    per_seq = max(0.0, sum((r - mx) * (s - my) for s, r in decode) / var)
    lengths = [r["rollout/response_len/mean"] for r in records if "rollout/response_len/mean" in r]
    # Completion tokens a step trains: its samples times the mean response length the actor logged.
    mean_len = sum(lengths) / len(lengths) if lengths else base.response_fraction * max_new_tokens

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2] if values else 0.0

    train_s = median(phases["forward_backward"]) + median(phases["optimizer"])
    tokens = max(1.0, samples_per_step * mean_len)
    return base.model_copy(update={
        "response_fraction": min(1.0, mean_len / max_new_tokens),
        "decode_base_s": max(0.0, my - per_seq * mx), "decode_per_seq_s": per_seq,
        "train_base_s": 0.0, "train_per_token_s": train_s / tokens, "broadcast_s": median(phases["broadcast"]),
    })


def total_variation(a: list[float], b: list[float]) -> float:
    return 0.5 * sum(abs(x - y) for x, y in zip(a, b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="Optimizer steps of each real run.")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="Which configs (comma-separated).")
    parser.add_argument("--keep", default=None, help="Keep the run directories under this folder.")
    parser.add_argument("--reuse", action="store_true", help="With --keep: a config whose run there succeeded is not run again.")
    args = parse_bench_args(parser, {"steps": 3, "configs": "demo"}, argv)
    root = Path(args.keep or tempfile.mkdtemp(prefix="lag-prediction-"))
    print(f"# load average before: {os.getloadavg()}", flush=True)
    for name in args.configs.split(","):
        # The demo's 600 s wall-time limit stops a loaded machine's run short of its steps: lifted.
        overrides = [*CONFIGS[name], f"trainer.max_steps={args.steps}", "trainer.checkpoint_every=0", "max_wall_time_s=3600"]
        if args.smoke:  # the demo's smallest real settings, then this bench's step count
            overrides = [*SMOKE_DEMO_OVERRIDES, *overrides]
        config = load_config(DEMO_CONFIG, overrides)
        predicted = predict_lag(config)
        out = root / name
        if args.reuse and (out / "status.json").is_file() and json.loads((out / "status.json").read_text())["state"] == "succeeded":
            records = read_metrics(out / "metrics.jsonl")  # the run is kept: predict again only
        else:
            records = run_cli(DEMO_CONFIG, out, overrides)
        shares, mean, past = measured(records)
        speeds = fitted_speeds(out, LagAssumptions(), records, config.sampling.max_new_tokens, config.trainer.samples_per_step)
        refit = predict_lag(config, speeds)
        print(f"# {name}: predicted {[round(s, 3) for s in predicted.shares[:5]]} measured {[round(s, 3) for s in shares[:5]]} "
              f"fitted {[round(s, 3) for s in refit.shares[:5]]}; fitted speeds {json.dumps(speeds.model_dump())}", flush=True)
        print(f"RESULT lag_pred_mean_{name} {predicted.mean:.3f}")
        print(f"RESULT lag_measured_mean_{name} {mean:.3f}")
        print(f"RESULT lag_abs_error_{name} {abs(predicted.mean - mean):.3f}")
        print(f"RESULT lag_share_tv_{name} {total_variation(predicted.shares, shares):.3f}")
        print(f"RESULT lag_pred_mean_fitted_{name} {refit.mean:.3f}")
        print(f"RESULT lag_abs_error_fitted_{name} {abs(refit.mean - mean):.3f}")
        print(f"RESULT lag_share_tv_fitted_{name} {total_variation(refit.shares, shares):.3f}")
        print(f"RESULT lag_measured_past_max_{name} {past:.4f}")
        print(f"RESULT lag_pred_unbounded_past_max_{name} {predicted.share_past_max_lag:.4f}", flush=True)
    print(f"# load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
