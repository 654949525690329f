"""The platform at a lab's scale (issue 24): many live runs and open run pages, two web nodes,
thousands of finished runs to list and compare — on the real platform.

Started as `make demo` starts it (inflight/runs/management/commands/demo.py): a private embedded
PostgreSQL (fsync on, as the demo) and Redis (inflight.devservices), migrated; Daphne serving
`inflight.asgi:application` as a web node (`python -m inflight.web.node`) with the Redis channel layer. What is real and what is simulated in
the live part is said in bench/scale_live.py (writers simulate engines replaying a real demo run
at its own pace; ingest is RunSupervisor.deliver() + PlatformReporter, many runs per process;
clients are real WebSocket clients doing what run_page.js does).

1. one web node: `--live-runs` runs written and ingested, `--clients` pages spread over them (a
   `--rollout-viewers` share of them on the Rollouts tab, getting its rows and asking for its list and counts);
   push latency from a metrics line being written to a client receiving it (p50/p95/p99), pushes
   lost/duplicated/out of order, every client's series against its run's metrics.jsonl, the ingest
   backlog over time, the CPU each process used;
2. two web nodes (two `inflight.web.node`s, same PostgreSQL and Redis layer): clients spread over both;
   node B is killed half-way, its clients reconnect to node A; every client must end complete;
3. `--finished-runs` finished runs (a template run stored through the real ingest services —
   `--steps` steps x `--metrics` metrics, evals with per-problem rows, rollouts — then cloned in
   SQL with varied values, half of them in sweeps of four): run list (filter, sort, paginate),
   leaderboard, a 20-run compare, five sweeps compared as groups and a run's Timeline tab, server
   time p95 (Django's test client, in this process: no network); the compare page's charts
   interactive in Chromium (Playwright + Debian chromium); database size per run.

The demo run the writers replay is recorded by this bench on this machine with this code: the
demo's own command (`python -m rl_core run examples/tiny-cpu.yaml --out DIR`, about a minute) into
`--demo-run` (default var/bench-platform-scale/demo-recording), which keeps a `recording.json` saying
what recorded it (command, code hash, machine, commit, when). A later invocation replays it only if
all of those match, else it records anew: a kept older run, recorded by other code or elsewhere,
replays another rate (issue 32). The recording and its rate (metric lines/s per run) are printed and
in the RESULT lines (`demo_metric_lines_per_s_per_run`).

    .venv/bin/python bench/platform_scale.py [--live-runs 200 --clients 500 --finished-runs 2000]
    .venv/bin/python bench/platform_scale.py --live-runs 10 --clients 20 --finished-runs 50   # a quick look
    .venv/bin/python bench/platform_scale.py --smoke   # seconds-scale: records the demo at its smallest settings, 5 runs, 5 pages

`--smoke` also overlaps what the defaults keep apart (its figures prove the bench runs, they are
not measurements): the demo records while the services and a first web node start; that node
serves the one-node live phase and then the compare page in Chromium (the defaults start a fresh
node for each); the two live phases run side by side, each with its own runs, ingest process,
clients and web nodes (the two-node phase two fresh ones); pages get 1 s, not 3, to fetch their
snapshots before the replay.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

from benchlib import DEMO_CONFIG, REPO_ROOT, SMOKE_DEMO_OVERRIDES, free_port, parse_bench_args, platform_services  # first: it puts the checkout on sys.path
from scale_finished import finished_runs_phase
from scale_live import CLIENTS_LAG_FILE, DemoShape, ReplayWriter
from scale_processes import SERVICES_FOLDER, Processes, own_cpu_s, service_cpu_s
from scale_recording import DEFAULT_RECORDING, demo_recording

def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def web_env(port: int) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "inflight.settings", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{port}"}


def start_web_node(processes: Processes, name: str) -> str:
    """A web node as the demo starts it (`python -m inflight.web.node -b 127.0.0.1 -p PORT`: one Daphne
    process per core, up to 4, on one port); its CPU is the launcher's and its processes' together."""
    import urllib.request

    port = free_port()
    processes.start(name, [sys.executable, "-m", "inflight.web.node", "-b", "127.0.0.1", "-p", str(port)], web_env(port))
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=5)
            return f"http://127.0.0.1:{port}"
        except OSError:
            if processes.children[name].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start:\n{processes.log_tail(name)}")
            time.sleep(0.3)


def create_live_runs(user: Any, count: int, runs_root: Path, label: str) -> list[dict[str, Any]]:
    import yaml

    from inflight.runs import services
    from inflight.runs.models import Run, RunStatus

    config = yaml.safe_load(DEMO_CONFIG.read_text())
    runs = []
    for index in range(count):
        run = services.create_run(user, f"{label}-{index:03d}", config)
        run_dir = runs_root / str(run.pk)
        run_dir.mkdir(parents=True)
        # No worker yet (the sweeper leaves such a run alone): the ingest process that takes it is named
        # with its first heartbeat in live_phase. A placeholder worker that never beats had every run
        # created before the web node's first sweep marked lost, on a loaded machine (2026-11-28).
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, run_dir=str(run_dir), worker_name="")
        runs.append({"id": run.pk, "run_dir": str(run_dir), "config_yaml": yaml.safe_dump(run.config, sort_keys=False)})
    return runs


def expected_snapshot(run_dir: Path) -> dict[str, Any]:
    """The run's metrics.jsonl downsampled by the reference algorithm (tests/platform/downsample_oracle.py)."""
    from inflight.live.ingest import points_from_metrics_record
    from tests.platform.downsample_oracle import snapshot_from_points

    points = []
    for line_no, line in enumerate((run_dir / "metrics.jsonl").read_text().splitlines()):
        if line.strip():
            points += [(p.name, p.step, p.t, p.value) for p in points_from_metrics_record(line_no, json.loads(line))]
    return snapshot_from_points(points)


def keep_logs(folder: Path, label: str) -> None:
    """The processes' logs outlive the bench's folder (removed with its services): var/logs/platform-scale/."""

    target = REPO_ROOT / "var" / "logs" / "platform-scale" / label
    target.mkdir(parents=True, exist_ok=True)
    for log in folder.glob("*.log"):
        shutil.copyfile(log, target / log.name)


TIMELINE_WINDOW_S = 5


def p95_per_window(first_t: float, samples: Iterable[tuple[float, float]]) -> list[tuple[int, float]]:
    """[(window start s, p95 of its values)] of (unix time, value) samples, by TIMELINE_WINDOW_S from `first_t`."""
    by_window: dict[int, list[float]] = {}
    for t, value in samples:
        by_window.setdefault(int((t - first_t) // TIMELINE_WINDOW_S), []).append(value)
    return [(TIMELINE_WINDOW_S * w, percentile(values, 95)) for w, values in sorted(by_window.items())]


def live_phase(args: argparse.Namespace, label: str, shape: DemoShape, user: Any, cookie: str, folder: Path, nodes: int,
               shared_web: tuple[str, subprocess.Popen] | None = None) -> dict[str, Any]:
    """Runs written, ingested and watched; with two nodes the second is killed half-way.
    `shared_web` (--smoke): an already running web node (its URL and process) serves as the first node."""
    processes = Processes(folder)
    runs_root = folder / "runs"
    try:
        if shared_web is None:
            bases = [start_web_node(processes, f"web-{label}-{n}") for n in range(nodes)]
        else:
            processes.adopt(f"web-{label}-0", shared_web[1])
            bases = [shared_web[0]] + [start_web_node(processes, f"web-{label}-{n}") for n in range(1, nodes)]
        runs = create_live_runs(user, args.live_runs, runs_root, label)
        stop_ingest, stop_clients = folder / "stop-ingest", folder / "stop-clients"
        progress_files = []
        from inflight.runs.models import Run
        from inflight.runs.services import record_heartbeat

        for k in range(args.ingest_procs):
            spec_path = folder / f"ingest-{k}.json"
            progress_files.append(folder / f"ingest-{k}.progress")
            # Each ingest process beats as the worker of its runs, so the web nodes' lost-run sweeper
            # sees them alive (as a Celery worker's heartbeat thread does).
            worker = {"name": f"bench-ingest-{label}-{k}@scale", "incarnation": secrets.token_hex(8)}
            Run.objects.filter(pk__in=[run["id"] for run in runs[k::args.ingest_procs]]).update(worker_name=worker["name"], worker_incarnation=worker["incarnation"])
            # Its first beat, now: the process beats once it has started, and on a loaded machine Django's
            # start-up there took longer than INFLIGHT_WORKER_LOST_AFTER_S, so the web node's sweeper
            # marked every run lost before ingest began (2026-11-28, load 17).
            record_heartbeat(worker["name"], hostname="127.0.0.1", queues=["cpu"], gpus=[], cpu_count=os.cpu_count() or 0,
                             incarnation=worker["incarnation"])
            spec_path.write_text(json.dumps({"runs": runs[k::args.ingest_procs], "stop_file": str(stop_ingest), "progress_file": str(progress_files[-1]), "worker": worker,
                                             "threads": args.ingest_threads}))
            processes.start(f"ingest-{label}-{k}", [sys.executable, str(REPO_ROOT / "bench" / "scale_live.py"), "ingest", str(spec_path)], {**os.environ, "PYTHONUNBUFFERED": "1"})
        # Clients spread round-robin over runs and nodes; each lists the other nodes to fall back on.
        # Every `1 / rollout_viewers`-th page shows its run's Rollouts tab (its rows pushed, its list loaded).
        viewers_every = round(1 / args.rollout_viewers) if args.rollout_viewers > 0 else 0
        clients = [{"client": c, "run_id": runs[c % len(runs)]["id"], "bases": bases[c % nodes:] + bases[:c % nodes],
                    "watch_rollouts": bool(viewers_every) and c % viewers_every == viewers_every - 1} for c in range(args.clients)]
        client_spec = folder / "clients.json"
        ready_file, result_file = folder / "clients-ready", folder / "clients-result.json"
        client_spec.write_text(json.dumps({"clients": clients, "cookie": cookie, "stop_file": str(stop_clients), "ready_file": str(ready_file),
                                           "result_file": str(result_file), "connect_spacing_s": args.connect_spacing_s,
                                           "panel_poll_s": args.panel_poll_s}))
        processes.start(f"clients-{label}", [sys.executable, str(REPO_ROOT / "bench" / "scale_live.py"), "clients", str(client_spec)], {**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 600
        while not ready_file.exists():
            if processes.children[f"clients-{label}"].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"clients did not start:\n{processes.log_tail(f'clients-{label}')}")
            time.sleep(0.2)
        time.sleep(1.0 if args.smoke else 3.0)  # the last pages fetch their snapshots (--smoke: 5 pages, each in ms)
        cpu_before = {**{name: processes.cpu_of(name) for name in processes.children}, **service_cpu_s(), "writers": own_cpu_s()}
        writer = ReplayWriter(shape, [Path(run["run_dir"]) for run in runs], stagger_s=args.stagger_s, with_rollouts=not args.no_rollouts)
        started = time.monotonic()
        writer.start()
        backlog: list[tuple[float, int]] = []
        killed_at = None
        while True:
            time.sleep(1.0)
            elapsed = time.monotonic() - started
            delivered = sum(json.loads(p.read_text())["delivered_lines"] for p in progress_files if p.exists())
            backlog.append((elapsed, writer.written_lines() - delivered))
            if nodes > 1 and killed_at is None and elapsed >= shape.duration_s / 2:
                processes.stop(f"web-{label}-{nodes - 1}", signal.SIGKILL)  # a node dies, no goodbye to its sockets
                killed_at = elapsed
            if writer.done.is_set() and backlog[-1][1] <= 0:
                break
            if elapsed > shape.duration_s + args.drain_timeout_s:
                print(f"  [{label}] ingest did not catch up: backlog {backlog[-1][1]} lines")
                break
        processes.note_cpu()
        stop_ingest.write_text("stop")
        for k in range(args.ingest_procs):
            processes.children[f"ingest-{label}-{k}"].wait(400)  # it ends once its last pushes are sent
        ingest_done = time.monotonic() - started
        time.sleep(args.settle_s)  # the last pushes reach the pages (pacing, reconnects)
        stop_clients.write_text("stop")
        processes.children[f"clients-{label}"].wait(300)
        cpu_after = {**{name: processes.cpu_s.get(name, processes.cpu_of(name)) for name in processes.children}, **service_cpu_s(), "writers": own_cpu_s()}
        final_progress = [json.loads(p.read_text()) for p in progress_files if p.exists()]
        ingest_delays = [ms for progress in final_progress for ms in progress.get("ingest_delays_ms", [])]
        ingest_written_at = [t for progress in final_progress for t in progress.get("ingest_written_at", [])]
        unsent_max = max([progress.get("unsent_max", 0) for progress in final_progress], default=0)
        published = [ms for progress in final_progress for ms in progress.get("published_ms", [])]
        published_written_at = [t for progress in final_progress for t in progress.get("published_written_at", [])]
        sent_by_type: dict[str, list[int]] = {}
        for progress in final_progress:
            for kind, (count, size) in progress.get("sent_by_type", {}).items():
                sent_by_type.setdefault(kind, [0, 0])
                sent_by_type[kind][0] += count
                sent_by_type[kind][1] += size
        runs_per_write = [n for progress in final_progress for n in progress.get("runs_per_write", [])]
        call_ms: dict[str, list[float]] = {}
        for progress in final_progress:
            for kind, values in progress.get("call_ms", {}).items():
                call_ms.setdefault(kind, []).extend(values)
        records = json.loads(result_file.read_text())
        lag_file = result_file.with_name(CLIENTS_LAG_FILE)
        clients_lag = json.loads(lag_file.read_text()) if lag_file.exists() else []
        from inflight.runs.services import finish_run

        for run in runs:
            finish_run(run["id"], "succeeded")
    finally:
        processes.stop_all()
        keep_logs(folder, label)
    wall = ingest_done
    expected = {run["id"]: expected_snapshot(Path(run["run_dir"])) for run in runs}
    keys = ("shift", "max_step", "series")
    complete = [r for r in records if r["final"] is not None and {k: r["final"][k] for k in keys} == {k: expected[r["run_id"]][k] for k in keys}]
    latencies = [ms for r in records for ms in r["latencies_ms"]]
    # Push latency p95 per 5 s of the replay (by when the line was written): steady or in bursts; the
    # same for the ingest delay, the publish delay and the pages' own loop, to see which part was late.
    first_t = min((t for r in records for t in r.get("written_at", [])), default=0.0)
    latency_timeline = p95_per_window(first_t, [(t, ms) for r in records for t, ms in zip(r.get("written_at", []), r["latencies_ms"])])
    ingest_timeline = p95_per_window(first_t, zip(ingest_written_at, ingest_delays))
    published_timeline = p95_per_window(first_t, zip(published_written_at, published))
    lag_timeline = p95_per_window(first_t, [(t, ms) for t, ms in clients_lag if t >= first_t])
    killed_clients = [r for r, c in zip(records, clients) if nodes > 1 and c["bases"][0] == bases[-1]]
    return {
        "label": label, "nodes": nodes, "runs": len(runs), "clients": len(records), "wall_s": wall,
        "p50": percentile(latencies, 50), "p95": percentile(latencies, 95), "p99": percentile(latencies, 99), "samples": len(latencies),
        "gaps": sum(r["gaps"] for r in records), "dup_ooo": sum(r["duplicates_or_out_of_order"] for r in records),
        "complete": len(complete), "killed_clients": len(killed_clients),
        "killed_complete": sum(1 for r in killed_clients if r in complete),
        "reconnects": sum(max(0, r["connects"] - 1) for r in records), "killed_at_s": killed_at,
        "errors": [e for r in records for e in r["errors"]][:5], "error_count": sum(len(r["errors"]) for r in records),
        "backlog": backlog, "cpu": {name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after},
        "lines_written": writer.written_lines(),
        # Every line ingest delivered, by kind: what its capacity is measured in.
        "lines_delivered": {"metrics": writer.written_lines(), "evals": len(shape.evals) * len(runs),
                            "rollouts": len(shape.rollout_lines) * len(runs) if not args.no_rollouts else 0},
        "latency_timeline": latency_timeline, "ingest_timeline": ingest_timeline,
        "clients_lag_p95": percentile([ms for _, ms in clients_lag], 95), "clients_lag_max": max((ms for _, ms in clients_lag), default=0.0),
        "published_timeline": published_timeline,
        "clients_lag_timeline": lag_timeline,
        "panel_requests": sum(len(r.get("panel_ms", [])) for r in records), "panel_errors": sum(r.get("panel_errors", 0) for r in records),
        "panel_p95": percentile([ms for r in records for ms in r.get("panel_ms", [])], 95),
        "rollout_viewers": sum(1 for c in clients if c["watch_rollouts"]), "rollout_rows_received": sum(r.get("rollout_rows", 0) for r in records),
        "rollouts_requests": sum(len(r.get("rollouts_ms", [])) for r in records), "rollouts_errors": sum(r.get("rollouts_errors", 0) for r in records),
        "rollouts_p95": percentile([ms for r in records for ms in r.get("rollouts_ms", [])], 95),
        "ingest_calls": {kind: (len(values), sum(values) / 1000.0, percentile(values, 99), max(values)) for kind, values in sorted(call_ms.items())},
        "sent_by_type": sent_by_type, "runs_per_write": runs_per_write,
        "published_p50": percentile(published, 50), "published_p95": percentile(published, 95),
        "ingest_p50": percentile(ingest_delays, 50), "ingest_p95": percentile(ingest_delays, 95), "unsent_max": unsent_max,
    }


def in_thread(function: Any, *args: Any) -> Any:
    """`function(*args)` on a worker thread, closing the thread's own database connections after."""
    from django.db import connections

    try:
        return function(*args)
    finally:
        connections.close_all()


def report_live(result: dict[str, Any]) -> None:
    label = result["label"]
    print(f"[{label}] {result['runs']} runs, {result['clients']} clients on {result['nodes']} web node(s), {result['lines_written']} metrics lines "
          f"in {result['wall_s']:.0f} s; push latency p50/p95/p99 {result['p50']:.0f}/{result['p95']:.0f}/{result['p99']:.0f} ms "
          f"over {result['samples']} (client, line) pairs")
    print(f"[{label}] gaps {result['gaps']}, duplicated/out of order {result['dup_ooo']}, complete series {result['complete']}/{result['clients']}, "
          f"reconnects {result['reconnects']}" + (f", node killed at {result['killed_at_s']:.0f} s: {result['killed_complete']}/{result['killed_clients']} of its clients complete" if result["killed_at_s"] else ""))
    if result["errors"]:
        print(f"[{label}] client errors: {result['error_count']} (first 5: {result['errors']})")
    print(f"[{label}] of which ingest (line written -> stored and committed) p50/p95 {result['ingest_p50']:.0f}/{result['ingest_p95']:.0f} ms; "
          f"in Redis (published) p50/p95 {result['published_p50']:.0f}/{result['published_p95']:.0f} ms; "
          f"most pushes waiting for the channel layer in one ingest process: {result['unsent_max']}")
    print(f"[{label}] ingest threads' reporter calls (count, total s, p99 ms, max ms): "
          + ", ".join(f"{kind} {n}/{total:.1f}s/{p99:.0f}/{worst:.0f}" for kind, (n, total, p99, worst) in result["ingest_calls"].items()))
    writes = result["runs_per_write"]
    if writes:
        print(f"[{label}] metrics writer statements: {len(writes)}, runs per statement mean {sum(writes) / len(writes):.1f}, "
              f"p50 {percentile(writes, 50):.0f}, max {max(writes)}")
    print(f"[{label}] pushes sent to run groups (count, forwarded KB): "
          + ", ".join(f"{kind} {count}/{size / 1024:.0f}" for kind, (count, size) in sorted(result["sent_by_type"].items())))
    if result["panel_requests"] or result["panel_errors"]:
        print(f"[{label}] panel.json refreshes (as run_page.js): {result['panel_requests']} answered, p95 {result['panel_p95']:.0f} ms, {result['panel_errors']} failed")
    print(f"[{label}] pages on the Rollouts tab: {result['rollout_viewers']} of {result['clients']}, rollout rows they received "
          f"{result['rollout_rows_received']}; rollouts.json loads and counts.json refreshes (as rollouts.js): {result['rollouts_requests']} answered, "
          f"p95 {result['rollouts_p95']:.0f} ms, {result['rollouts_errors']} failed")
    print(f"[{label}] push latency p95 per 5 s of the replay: " + ", ".join(f"{t}s:{ms:.0f}" for t, ms in result["latency_timeline"]))
    print(f"[{label}] ingest delay p95 per 5 s of the replay: " + ", ".join(f"{t}s:{ms:.0f}" for t, ms in result["ingest_timeline"]))
    print(f"[{label}] in Redis (published) p95 per 5 s of the replay: " + ", ".join(f"{t}s:{ms:.0f}" for t, ms in result["published_timeline"]))
    print(f"[{label}] the pages' own process (the harness, on the same cores): event loop late p95 {result['clients_lag_p95']:.0f} ms, "
          f"max {result['clients_lag_max']:.0f} ms; p95 per 5 s: " + ", ".join(f"{t}s:{ms:.0f}" for t, ms in result["clients_lag_timeline"]))
    samples = result["backlog"][:: max(1, len(result["backlog"]) // 12)]
    print(f"[{label}] ingest backlog (metrics lines written, not yet stored) over time: " + ", ".join(f"{t:.0f}s:{b}" for t, b in samples))
    wall = max(result["wall_s"], 1e-9)
    print(f"[{label}] CPU (cores busy on average): " + ", ".join(f"{name} {cpu / wall:.2f}" for name, cpu in sorted(result["cpu"].items())))
    delivered = result["lines_delivered"]
    print(f"[{label}] ingest capacity: {ingest_lines_per_cpu_s(result):.0f} lines per CPU-second of the ingest processes and PostgreSQL "
          f"({', '.join(f'{count} {kind}' for kind, count in delivered.items())} lines delivered)")


def ingest_lines_per_cpu_s(result: dict[str, Any]) -> float:
    """Lines delivered (metrics, evaluations, rollout stream) per CPU-second ingest cost: its
    processes' and PostgreSQL's (whose CPU also serves the web node's reads: a lower bound)."""
    cpu = sum(seconds for name, seconds in result["cpu"].items() if name.startswith("ingest-") or name == "postgres")
    return sum(result["lines_delivered"].values()) / max(cpu, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-runs", type=int, default=200, help="Live runs written and ingested at once.")
    parser.add_argument("--clients", type=int, default=500, help="Open run pages (WebSocket clients), spread over the live runs.")
    parser.add_argument("--finished-runs", type=int, default=2000, help="Finished runs in the database for the list/leaderboard/compare timings.")
    parser.add_argument("--steps", type=int, default=200, help="Steps of each finished run.")
    parser.add_argument("--metrics", type=int, default=40, help="Metrics logged at every step of each finished run.")
    parser.add_argument("--demo-run", default=str(DEFAULT_RECORDING),
                        help="Where the demo run the writers replay is recorded (and kept for the next invocation while code and machine "
                             "are the same; see the docstring). --smoke records its own, at the demo's smallest settings.")
    parser.add_argument("--duration-s", type=float, default=None, help="Replay only the demo run's first seconds (default: all of it).")
    parser.add_argument("--ingest-procs", type=int, default=2, help="Ingest processes (the runs are split among them).")
    parser.add_argument("--ingest-threads", type=int, default=4, help="Polling threads per ingest process (a Celery worker's threads).")
    parser.add_argument("--no-rollouts", action="store_true", help="Leave the rollout stream out of the replay.")
    parser.add_argument("--stagger-s", type=float, default=20.0,
                        help="Runs start spread over this many seconds. 20 s: about one period of the demo's evaluation and "
                             "kept-rollout cycle (every 5th step), so the runs are at different steps as a lab's are; 2 s: "
                             "a sweep launched at once, every run evaluating and storing rollouts in the same seconds.")
    parser.add_argument("--connect-spacing-s", type=float, default=0.01, help="Pause between opening two pages.")
    parser.add_argument("--panel-poll-s", type=float, default=60.0, help="Each page refreshes its actions panel (panel.json) as run_page.js does: on run.panel / eval.score pushes, status changes and (re)connects, plus a safety poll this often while the run is active (60 s in run_page.js; 5 min once ended); 0: never.")
    parser.add_argument("--rollout-viewers", type=float, default=0.2,
                        help="Share of the pages showing their run's Rollouts tab (new rollout rows pushed to them, their list and counts "
                             "fetched as rollouts.js does); the others show the charts (the page's first tab), which get no rollout rows. "
                             "1: every page.")
    parser.add_argument("--settle-s", type=float, default=5.0, help="Wait after ingest caught up before reading the pages.")
    parser.add_argument("--drain-timeout-s", type=float, default=300.0, help="Give up on ingest catching up this long after the replay ended.")
    parser.add_argument("--skip-live", action="store_true", help="Only the finished-runs part.")
    parser.add_argument("--skip-finished", action="store_true", help="Only the live parts.")
    parser.add_argument("--skip-two-nodes", action="store_true", help="Only the one-web-node live phase (its RESULT lines for two nodes are left out).")
    parser.add_argument("--repeats", type=int, default=20, help="Timed requests per view (p95 over them).")
    parser.add_argument("--browser-loads", type=int, default=5, help="Loads of the compare page in Chromium (the first with a cold cache).")
    parser.add_argument("--db-dir", default=None, help="Keep PostgreSQL + Redis in this folder across invocations (the finished runs are loaded once); default: private and removed.")
    args = parse_bench_args(parser, smoke={
        "live_runs": 5, "clients": 5, "finished_runs": 5, "steps": 20, "metrics": 5, "ingest_procs": 1, "ingest_threads": 2,
        "stagger_s": 1.0, "settle_s": 1.0, "drain_timeout_s": 60.0, "repeats": 1, "browser_loads": 1})
    sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens when logged to a file
    # One key for this process and the web nodes: a session made here is valid there.
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(40))
    os.environ.setdefault("INFLIGHT_SECURE_COOKIES", "0")
    # A lab's many live runs belong to many people; here one user owns them all.
    os.environ.setdefault("INFLIGHT_MAX_ACTIVE_RUNS_PER_USER", "100000")
    # --smoke records its own demo run every time, at the demo's smallest settings, in its private
    # folder: started here, so that its ~15 s (a process of the demo's own, no services needed)
    # overlap the services' start-up and the web node's.
    with ThreadPoolExecutor(1) as pool:
        recording = pool.submit(demo_recording, work_folder() / "demo-recording", list(SMOKE_DEMO_OVERRIDES)) if args.smoke else None
        if args.db_dir is None:
            SERVICES_FOLDER.append(REPO_ROOT / "var" / "bench-platform-scale" / str(os.getpid()))  # platform_services' folder
            with platform_services("platform-scale"):
                return run_bench(args, recording)
        return run_bench_on_kept_services(args, recording)


def work_folder() -> Path:
    """This invocation's folder for the runs and logs (removed with private services)."""
    return REPO_ROOT / "var" / "bench-platform-scale" / str(os.getpid()) / "work"


def run_bench_on_kept_services(args: argparse.Namespace, recording: Future | None) -> int:
    """As platform_services, but the services stay up in `--db-dir` for the next invocation."""
    from inflight.devservices import start_services

    services_info = start_services(Path(args.db_dir), postgres_port=free_port(), redis_port=free_port())
    SERVICES_FOLDER.append(Path(args.db_dir).resolve())
    os.environ.update(services_info.env())
    key_file = Path(args.db_dir) / "bench-secret-key"  # sessions made by an earlier invocation stay valid
    if not key_file.exists():
        key_file.write_text(os.environ["SECRET_KEY"])
    os.environ["SECRET_KEY"] = key_file.read_text()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(f"services kept in {args.db_dir} ({services_info.database_url}); stop them with: .venv/bin/python -m inflight.devservices stop --dir {args.db_dir}")
    return run_bench(args, recording)


def run_bench(args: argparse.Namespace, recording_future: Future | None = None) -> int:
    """`recording_future` (--smoke): the demo recording main() started, (folder, recording.json)."""
    shared = Processes(work_folder()) if args.smoke else None
    try:
        return _run_bench(args, recording_future, shared)
    finally:
        if shared is not None:
            shared.stop_all()
            keep_logs(shared.folder, "shared")


def _run_bench(args: argparse.Namespace, recording_future: Future | None, shared: Processes | None) -> int:
    """`shared` (--smoke): one web node started here (while the demo records) serves the one-node
    live phase and then the finished phase's browser, where the defaults start a fresh one for
    each (each Daphne start-up is ~3 of the smoke's CPU-seconds)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    folder = work_folder()
    user = get_user_model().objects.filter(username="bench").first() or get_user_model().objects.create_user("bench", password="bench-password-1")
    from inflight.accounts.services import create_token

    client = Client()
    client.force_login(user)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {create_token(user).key}"  # the API's requests; pages use the session
    cookie = client.cookies["sessionid"].value
    results: dict[str, Any] = {}
    ok = True
    shared_web: tuple[str, subprocess.Popen] | None = None
    if shared is not None:
        folder.mkdir(parents=True, exist_ok=True)
        shared_web = (start_web_node(shared, "web-shared"), shared.children["web-shared"])  # while the demo records
    demo, recording = recording_future.result() if recording_future is not None else demo_recording(Path(args.demo_run), [])
    args.demo_run = str(demo)  # the finished runs' template reads its metric names, evaluations and rollouts
    shape = DemoShape.read(demo, args.duration_s)
    print(f"demo run {demo}: recorded by `{recording['command']}` at {recording['recorded_at']} (commit {recording['commit']}, "
          f"{recording['record_s']:.0f} s, load {recording['load_average'][0]}) on {recording['machine']}")
    print(f"demo run {demo}: {shape.describe()}")
    if not args.skip_live:
        print(f"{args.live_runs} runs starting over {args.stagger_s:.0f} s, each replaying the demo run at its own rate")
        phases = (("one-node", 1), ("two-nodes", 2))[: 1 if args.skip_two_nodes else 2]
        for label, _ in phases:
            (folder / label).mkdir(parents=True, exist_ok=True)
        if shared_web is not None and len(phases) == 2:
            # --smoke runs the two phases side by side (each has its own runs, ingest, clients and
            # web nodes: the one-node phase the shared node, the two-node phase two fresh ones, so
            # the one-node phase's web node CPU is its own), not one after the other: ~12 s of wall less.
            with ThreadPoolExecutor(len(phases)) as pool:
                futures = [pool.submit(in_thread, live_phase, args, label, shape, user, cookie, folder / label, nodes,
                                       shared_web if nodes == 1 else None) for label, nodes in phases]
            for (label, _), future in zip(phases, futures):
                results[label] = future.result()
                report_live(results[label])
        else:
            for label, nodes in phases:
                results[label] = live_phase(args, label, shape, user, cookie, folder / label, nodes, shared_web)
                report_live(results[label])
    if not args.skip_finished:
        (folder / "finished").mkdir(parents=True, exist_ok=True)
        browser_node = start_web_node if shared_web is None else (lambda _processes, _name: shared_web[0])  # type: ignore[index]
        results["finished"] = finished_runs_phase(args, user, client, folder / "finished", Processes(folder / "finished"), browser_node)
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"RESULT demo_metric_lines_per_s_per_run {len(shape.metrics) / shape.duration_s:.2f}")
    if "one-node" in results:
        one = results["one-node"]
        two = results.get("two-nodes", {"gaps": 0, "dup_ooo": 0, "complete": 0, "clients": 0, "killed_clients": 0, "p95": float("nan")})
        lost = one["gaps"] + one["dup_ooo"] + two["gaps"] + two["dup_ooo"]
        both_complete = int(two["complete"] == two["clients"] and two["killed_clients"] > 0)
        ok = ok and lost == 0 and one["complete"] == one["clients"] and (both_complete == 1 or args.skip_two_nodes)
        print(f"RESULT push_p50_ms {one['p50']:.1f}")
        print(f"RESULT push_p95_ms {one['p95']:.1f}")
        print(f"RESULT push_p99_ms {one['p99']:.1f}")
        print(f"RESULT pushes_lost {lost}")
        print(f"RESULT series_complete_one_node {one['complete']}/{one['clients']}")
        if not args.skip_two_nodes:
            print(f"RESULT two_web_nodes_complete {both_complete}")
            print(f"RESULT two_nodes_push_p95_ms {two['p95']:.1f}")
        print(f"RESULT ingest_backlog_max_lines {max(b for _, b in one['backlog'])}")
        print(f"RESULT ingest_lines_per_cpu_s {ingest_lines_per_cpu_s(one):.0f}")
        print(f"RESULT web_node_cpu_cores_one_node {sum(c for n, c in one['cpu'].items() if n.startswith('web-')) / one['wall_s']:.2f}")
    if "finished" in results:
        for key, value in results["finished"].items():
            print(f"RESULT {key} {value}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
