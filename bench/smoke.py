"""`make bench-smoke`: every bench in bench/ once with `--smoke` (its smallest real settings, the
same code path), so a bench that no longer runs fails CI instead of rotting until someone wants a
figure from it.

A bench is every `bench/*.py` except the helper modules below: a new bench is in the smoke the
moment it is added. Each must exit 0 and print at least one `RESULT <name> <value>` line. Its
output goes to var/logs/bench-smoke/NAME.log; its RESULT lines and time are printed here; a failed
bench prints its output's tail. Two benches run at a time (the machine has two cores and the
smoke is CPU-bound: three at a time is no faster, bench/RESULTS.md), the slowest first.
Ends with `bench-smoke: N passed, M failed` and exits 1 when any failed, naming them.

Each bench is forked from this process, which imported torch, transformers and the engine once
(`WARM_MODULES`), and runs as its own script (runpy, `--smoke`, its own session, cwd and log): the
same bench code a fresh `python bench/NAME.py --smoke` runs, without ~8 CPU-s of imports each
(`--fresh` starts each as a fresh interpreter instead). What a bench starts (runs, servers,
services) starts as it always does.

    .venv/bin/python bench/smoke.py [--jobs 2] [--only NAME ...] [--skip NAME ...] [--fresh]

Smoke figures are not measurements (tiny settings, two benches sharing the cores): they prove the
bench runs. Real figures come from a bench's defaults on a quiet machine (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rl_core.common.processes import output_to_log

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
LOG_DIR = REPO_ROOT / "var" / "logs" / "bench-smoke"
# Modules the benches import or start as their own children; no bench of their own.
HELPER_MODULES = frozenset({"benchlib", "smoke", "scale_live", "scale_finished", "scale_recording"})
# Started first, so the longest ones do not start last and leave one core idle at the end (rough
# smoke times on the 2-core machine; the rest take seconds each).
SLOWEST_FIRST = ("multinode", "vs_trl", "weight_update_vllm", "platform_scale", "tools", "cpu_kernels",
                 "accelerations_learning", "async_vs_sync", "role_start", "real_size", "lag_prediction", "rollouts",
                 "weight_update", "demo_health", "snapshot", "ingest")
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


# What most benches import before their first line of work (~8 CPU-s a fresh interpreter, about
# half of a small bench's smoke): imported once here, before any bench is forked.
WARM_MODULES = ("torch", "transformers", "transformers.models.auto.modeling_auto",
                "transformers.models.auto.tokenization_auto", "transformers.models.qwen2.modeling_qwen2",
                "rl_core.inference.engine", "rl_core.inference.server", "rl_core.trainer.loop", "benchlib")


@dataclass
class Running:
    name: str
    pid: int
    started: float
    log_path: Path


def warm_up() -> float:
    """Import WARM_MODULES in this process; the CPU seconds it took."""
    import importlib

    before = time.process_time()
    for module in WARM_MODULES:
        importlib.import_module(module)
    return time.process_time() - before


def start_bench(name: str, warm: bool) -> Running:
    """`python bench/NAME.py --smoke` in its own session (at the timeout it is killed with every
    process it started), its output in var/logs/bench-smoke/NAME.log. `warm`: forked from this
    process, which imported WARM_MODULES once, and run as its script (runpy) — the bench's code as a
    fresh interpreter runs it; otherwise a fresh interpreter."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}.log"
    script = BENCH_DIR / f"{name}.py"
    started = time.monotonic()
    if not warm:
        with open(log_path, "wb") as log:
            process = subprocess.Popen([sys.executable, str(script), "--smoke"], cwd=REPO_ROOT,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return Running(name, process.pid, started, log_path)
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        return Running(name, pid, started, log_path)
    os._exit(run_forked(script, log_path))  # never returns to the scheduler's loop


def run_forked(script: Path, log_path: Path) -> int:
    """In the forked child: become `python SCRIPT --smoke`; its exit status."""
    code = 1
    try:
        os.setsid()
        output_to_log(log_path, append=False)
        os.chdir(REPO_ROOT)
        sys.argv = [str(script), "--smoke"]
        sys.path[0] = str(BENCH_DIR)  # as for `python bench/NAME.py`
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as exc:  # as Python ends on it: an int is the status, None 0, anything else printed and 1
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - printed as Python prints an uncaught exception
        traceback.print_exc()
    finally:
        # What Python's own exit does before the process ends: wait for non-daemon threads, run
        # atexit handlers (servers and services the bench registered to stop), flush.
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def finish(running: Running, status: int | None, cpu_s: float) -> Outcome:
    output = running.log_path.read_text(errors="replace")
    results = [line.strip() for line in output.splitlines() if line.startswith("RESULT ")]
    returncode = None if status is None else os.waitstatus_to_exitcode(status)
    return Outcome(running.name, returncode, time.monotonic() - running.started, cpu_s, results,
                   "\n".join(output.splitlines()[-40:]))


def run_all(names: list[str], jobs: int, timeout_s: float, warm: bool, report: Callable[[Outcome], None]) -> list[Outcome]:
    """Every bench, `jobs` at a time, from one thread (forking from a process with other threads
    running could copy a lock another thread holds); `report` is called as each ends."""
    queue, running, outcomes = list(names), {}, []
    while queue or running:
        while queue and len(running) < max(1, jobs):
            bench = start_bench(queue.pop(0), warm)
            running[bench.pid] = bench
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid in running:  # its CPU: its own and its reaped children's (not the daemonized services)
            outcomes.append(finish(running.pop(pid), status, usage.ru_utime + usage.ru_stime))
            report(outcomes[-1])
            continue
        for bench in list(running.values()):
            if time.monotonic() - bench.started > timeout_s:
                os.killpg(bench.pid, signal.SIGKILL)
                _, _, usage = os.wait4(bench.pid, 0)
                outcomes.append(finish(running.pop(bench.pid), None, usage.ru_utime + usage.ru_stime))
                report(outcomes[-1])
        time.sleep(0.2)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="Benches run at once.")
    parser.add_argument("--only", nargs="+", default=None, help="Run these benches only (names without .py).")
    parser.add_argument("--skip", nargs="+", default=[], help="Leave these benches out (said in the summary).")
    parser.add_argument("--fresh", action="store_true", help="Start each bench as a fresh interpreter (default: forked from this one, which imported torch and transformers once).")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="A bench still running after this long is killed and fails.")
    args = parser.parse_args(argv)
    names = [name for name in discover() if (args.only is None or name in args.only) and name not in args.skip]
    unknown = sorted(set(args.only or []) - set(discover()))
    if unknown:
        raise SystemExit(f"bench-smoke: no such bench: {', '.join(unknown)}")
    sys.stdout.reconfigure(line_buffering=True)
    warm = not args.fresh
    print(f"bench-smoke: {len(names)} benches, {args.jobs} at a time"
          f"{'' if warm else ', each a fresh interpreter'}: {', '.join(names)}")
    started = time.monotonic()
    if warm:
        print(f"bench-smoke: {', '.join(WARM_MODULES)} imported once in {warm_up():.1f} CPU-s; each bench is forked from here")

    def report(outcome: Outcome) -> None:
        verdict = "ok" if outcome.passed else f"FAILED ({outcome.why()})"
        print(f"[{outcome.name}] {verdict} in {outcome.seconds:.1f} s ({outcome.cpu_s:.1f} CPU-s)")
        for line in outcome.results:
            print(f"  {line}")
        if not outcome.passed:
            print(f"  --- last lines of {LOG_DIR / (outcome.name + '.log')} ---")
            print("\n".join(f"  | {line}" for line in outcome.tail.splitlines()))

    outcomes = run_all(names, args.jobs, args.timeout_s, warm, report)
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
