"""`make bench-smoke`: every bench in bench/ once with `--smoke` (its smallest real settings, the
same code path), so a bench that no longer runs fails CI instead of rotting until someone wants a
figure from it.

A bench is every `bench/*.py` except the helper modules below: a new bench is in the smoke the
moment it is added. Each must exit 0 and print at least one `RESULT <name> <value>` line. Its
output goes to var/logs/bench-smoke/NAME.log; its RESULT lines and time are printed here; a failed
bench prints its output's tail. Two benches run at a time (the machine has two cores; most of a
smoke is process start-up and waiting on services, so two overlap well), the slowest first.
Ends with `bench-smoke: N passed, M failed` and exits 1 when any failed, naming them.

    .venv/bin/python bench/smoke.py [--jobs 2] [--only NAME ...] [--skip NAME ...]

Smoke figures are not measurements (tiny settings, two benches sharing the cores): they prove the
bench runs. Real figures come from a bench's defaults on a quiet machine (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
LOG_DIR = REPO_ROOT / "var" / "logs" / "bench-smoke"
# Modules the benches import or start as their own children; no bench of their own.
HELPER_MODULES = frozenset({"benchlib", "smoke", "scale_live", "scale_finished", "scale_recording"})
# Started first, so the longest ones do not start last and leave one core idle at the end (rough
# smoke times on the 2-core machine; the rest take seconds each).
SLOWEST_FIRST = ("weight_update_vllm", "platform_scale", "multinode", "vs_trl", "accelerations_learning", "async_vs_sync",
                 "cpu_kernels", "demo_health", "rollouts", "ingest")
DEFAULT_TIMEOUT_S = 420.0  # per bench; the slowest (vs_trl: ~140 CPU s) takes 2-3 minutes on a quiet 2-core machine


@dataclass
class Outcome:
    name: str
    returncode: int | None = None  # None: killed at the timeout
    seconds: float = 0.0
    cpu_s: float = 0.0  # the bench's and its reaped children's CPU (not the daemonized PostgreSQL/Redis)
    results: list[str] = field(default_factory=list)
    tail: str = ""

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and bool(self.results)

    def why(self) -> str:
        if self.returncode is None:
            return f"still running after {self.seconds:.0f} s: killed"
        if self.returncode != 0:
            return f"exit {self.returncode}"
        return "no RESULT line"


def discover() -> list[str]:
    names = sorted(path.stem for path in BENCH_DIR.glob("*.py") if path.stem not in HELPER_MODULES)
    order = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    return sorted(names, key=lambda name: order.get(name, len(order)))


def run_one(name: str, timeout_s: float) -> Outcome:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        # Its own session: at the timeout the bench and every process it started are killed together.
        process = subprocess.Popen([sys.executable, str(BENCH_DIR / f"{name}.py"), "--smoke"], cwd=REPO_ROOT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        returncode, cpu_s = wait_with_usage(process, started + timeout_s)
    output = log_path.read_text(errors="replace")
    results = [line.strip() for line in output.splitlines() if line.startswith("RESULT ")]
    return Outcome(name, returncode, time.monotonic() - started, cpu_s, results, "\n".join(output.splitlines()[-40:]))


def wait_with_usage(process: subprocess.Popen, deadline: float) -> tuple[int | None, float]:
    """(exit status, CPU seconds) of `process` (os.wait4: its own and its reaped children's CPU,
    what it would take on a quiet machine); (None, ...) after killing its session at `deadline`."""
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            _, _, usage = os.wait4(process.pid, 0)
            process.returncode = -signal.SIGKILL
            return None, usage.ru_utime + usage.ru_stime
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="Benches run at once.")
    parser.add_argument("--only", nargs="+", default=None, help="Run these benches only (names without .py).")
    parser.add_argument("--skip", nargs="+", default=[], help="Leave these benches out (said in the summary).")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="A bench still running after this long is killed and fails.")
    args = parser.parse_args(argv)
    names = [name for name in discover() if (args.only is None or name in args.only) and name not in args.skip]
    unknown = sorted(set(args.only or []) - set(discover()))
    if unknown:
        raise SystemExit(f"bench-smoke: no such bench: {', '.join(unknown)}")
    sys.stdout.reconfigure(line_buffering=True)
    print(f"bench-smoke: {len(names)} benches, {args.jobs} at a time: {', '.join(names)}")
    started = time.monotonic()
    outcomes: list[Outcome] = []
    queue = list(names)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                name = queue.pop(0)
            outcome = run_one(name, args.timeout_s)
            with lock:
                outcomes.append(outcome)
                verdict = "ok" if outcome.passed else f"FAILED ({outcome.why()})"
                print(f"[{name}] {verdict} in {outcome.seconds:.1f} s ({outcome.cpu_s:.1f} CPU-s)")
                for line in outcome.results:
                    print(f"  {line}")
                if not outcome.passed:
                    print(f"  --- last lines of {LOG_DIR / (name + '.log')} ---")
                    print("\n".join(f"  | {line}" for line in outcome.tail.splitlines()))

    threads = [threading.Thread(target=worker) for _ in range(max(1, args.jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    print(f"\nbench-smoke: {wall:.0f} s in all ({args.jobs} at a time, load average {os.getloadavg()[0]:.1f}); per bench, "
          "wall (CPU) s: " + ", ".join(f"{o.name} {o.seconds:.0f} ({o.cpu_s:.0f})" for o in sorted(outcomes, key=lambda o: -o.seconds)))
    if args.skip:
        print(f"bench-smoke: left out by --skip: {', '.join(args.skip)}")
    failed = [o for o in outcomes if not o.passed]
    if failed:
        print("bench-smoke: failed: " + ", ".join(f"{o.name} ({o.why()})" for o in failed))
    # The plain closing line CI reads ("N passed, N failed").
    print(f"bench-smoke: {len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
