"""What a run costs to start with its CPU roles forked from one fork server (the default,
rl_core/launch/role_forks.py) against each role a fresh interpreter (`INFLIGHT_FORK_ROLES=0`).

Runs the demo at its smallest real settings (`benchlib.SMOKE_DEMO_OVERRIDES`: 4 steps, start-up
is most of it) as a user does, `python -m rl_core run CONFIG --out DIR --quiet`, alternating
forked and fresh runs, one at a time. Per run: the CPU seconds of the launcher and everything it
reaped (its roles, or its fork server and the roles that server reaped: the launcher stops and
waits for it at the end), and the wall time.

    .venv/bin/python bench/role_start.py [--pairs 3] [--config examples/tiny-cpu.yaml] [--smoke]

Ends with `RESULT role_forks_cpu_ratio <forked / fresh CPU-s, medians>` and `RESULT
role_forks_wall_ratio <forked / fresh wall s, medians>`, plus each side's medians. `--smoke`: one pair.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import DEMO_CONFIG, REPO_ROOT, parse_bench_args, smoke_demo_config  # first: it puts the checkout on sys.path


def timed_run(config: Path, out: Path, forked: bool) -> tuple[float, float]:
    """(CPU s, wall s) of one run of `config` into `out`."""
    command = [sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"]
    env = {**os.environ, "INFLIGHT_FORK_ROLES": "1" if forked else "0"}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed ({process.returncode}):\n{stderr.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="Forked and fresh runs, alternated.")
    parser.add_argument("--config", type=Path, default=DEMO_CONFIG, help="Run config; the smoke overrides are applied to it.")
    args = parse_bench_args(parser, {"pairs": 1}, argv)
    figures: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="role-start-") as scratch:
        config = smoke_demo_config(Path(scratch), args.config)
        for pair in range(args.pairs):
            for forked in (True, False):
                cpu, wall = timed_run(config, Path(scratch) / f"run-{pair}-{'forked' if forked else 'fresh'}", forked)
                figures[forked].append((cpu, wall))
                print(f"pair {pair}: {'forked' if forked else 'fresh '} {cpu:.1f} CPU-s, {wall:.1f} s wall (load {os.getloadavg()[0]:.1f})", flush=True)
    cpu = {side: statistics.median(c for c, _ in runs) for side, runs in figures.items()}
    wall = {side: statistics.median(w for _, w in runs) for side, runs in figures.items()}
    print(f"RESULT role_forks_cpu_s {cpu[True]:.2f}")
    print(f"RESULT role_fresh_cpu_s {cpu[False]:.2f}")
    print(f"RESULT role_forks_cpu_ratio {cpu[True] / cpu[False]:.3f}")
    print(f"RESULT role_forks_wall_ratio {wall[True] / wall[False]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
