"""The demo with CPU linear layers on oneDNN (the default) vs torch's stock MKL path.

Runs the product's CLI (`python -m rl_core run CONFIG`) twice per repeat, one after the other,
the only difference being INFLIGHT_CPU_LINEAR (rl_core/kernels/cpu.py): `onednn` (default) or
`torch`. Alternates the order across repeats so a drift in machine load favours neither side.

    .venv/bin/python bench/cpu_kernels.py [--config examples/tiny-cpu.yaml] [--max-steps 25] [--repeats 1] [--smoke]

Prints, per side, the median trainer step (`train/step_s`), wall seconds per optimizer step
(first to last step) and the held-out curve, then `RESULT` lines (onednn / torch: below 1 is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchlib import REPO_ROOT as REPO  # noqa: E402  (first: it puts the checkout on sys.path)
from benchlib import parse_bench_args, run_cli, smoke_demo_config  # noqa: E402

# rl_core/kernels/cpu.py's switch, by name: importing that module imports torch (~3.5 CPU-s) into a
# process that only starts runs. The check below keeps the two from drifting apart.
ENV_SWITCH = "INFLIGHT_CPU_LINEAR"
assert f'ENV_SWITCH = "{ENV_SWITCH}"' in (REPO / "rl_core" / "kernels" / "cpu.py").read_text(), "rl_core/kernels/cpu.py renamed its switch"


def run_demo(config: str, max_steps: int, kernel: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"bench-cpu-kernels-{kernel}-") as tmp:
        records = run_cli(config, Path(tmp) / "run", [f"trainer.max_steps={max_steps}"], env={ENV_SWITCH: kernel})
    t0 = records[0]["t"]
    steps = [(r["step"], r["t"] - t0) for r in records if "train/loss" in r]
    curve = " ".join(f"{r['step']}:{r['success/heldout']:.3f}" for r in records if "success/heldout" in r)
    (first_step, first_s), (last_step, last_s) = steps[0], steps[-1]
    return {
        "step_s": statistics.median(r["train/step_s"] for r in records if "train/step_s" in r),
        "wall_per_step": (last_s - first_s) / max(1, last_step - first_step),
        "curve": curve,  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/tiny-cpu.yaml", help="Run config YAML (both sides).")
    parser.add_argument("--max-steps", type=int, default=25, help="Optimizer steps per run.")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per side (medians are printed).")
    args = parse_bench_args(parser, smoke={"max_steps": 4})
    config = str(REPO / args.config) if not Path(args.config).is_absolute() else args.config
    sides = ["onednn", "torch"]
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="bench-cpu-kernels-") as scratch:
        if args.smoke:  # the config at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES)
            config = str(smoke_demo_config(Path(scratch), Path(config)))
        for repeat in range(args.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                run = run_demo(config, args.max_steps, side)
                runs[side].append(run)
                print(f"[{side} #{repeat}] train/step_s {run['step_s']:.3f}  wall/step {run['wall_per_step']:.3f}  "
                      f"held-out {run['curve']}", flush=True)
    median = {side: {key: statistics.median(r[key] for r in rs) for key in ("step_s", "wall_per_step")} for side, rs in runs.items()}
    print(f"RESULT onednn_over_torch_train_step_s {median['onednn']['step_s'] / median['torch']['step_s']:.3f}")
    print(f"RESULT onednn_over_torch_wall_per_step {median['onednn']['wall_per_step'] / median['torch']['wall_per_step']:.3f}")


if __name__ == "__main__":
    main()
