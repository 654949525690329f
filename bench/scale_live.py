"""The live half of bench/platform_scale.py: run-directory writers, the ingest processes and the
WebSocket clients. Run by platform_scale.py, never alone:

    python bench/scale_live.py ingest  SPEC.json   # RunSupervisor.deliver() + PlatformReporter for many runs
    python bench/scale_live.py clients SPEC.json   # asyncio WebSocket clients, as static/inflight/run_page.js

What is real and what is simulated:
- writers (`ReplayWriter`, a thread of the bench process) are simulated engines: they append the
  lines of a real demo run (metrics.jsonl, evals.jsonl with its per-problem file, and the rollout
  stream) to real run directories at that run's own pace (`t` of each metrics line is rewritten to
  the moment it is written: the push latency is measured from it);
- ingest is the worker's real path, minus Celery and the engine process: `workers.supervisor.RunSupervisor`
  (its `poll()`: the file tails, supersede checks, eval and rollout delivery, status, checkpoints,
  alert checks, the cancel flag) with the real `workers.tasks.PlatformReporter`
  (live.ingest → folding → broadcast to the Redis channel layer, alert rules, rollout
  ingest), woken by `workers.run_dir_watch.RunDirWatch` when a run writes a line and polled every
  INFLIGHT_POLL_S (250 ms), as a supervisor is — a few threads per process drive many runs each,
  where production has one Celery thread per run;
- clients are real WebSocket clients (tests/platform/run_page_client.py, on the `websockets`
  library) on Daphne, subscribed as the run page is: connect, fetch `snapshot.json`, apply `metrics.batch` pushes by seq (stale ignored, a gap
  refetches the snapshot), reconnect after a close (to the next web node, as a load balancer
  would send them) and refetch.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT / "platform", REPO_ROOT, REPO_ROOT / "tests" / "platform"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Beside the clients' result file: [(unix time, ms late), ...] of the pages' own event loop.
CLIENTS_LAG_FILE = "clients-loop-lag.json"
ROLLOUT_GROUP_LINES = 8  # the demo's group_size: the actor writes a group's samples together


# --------------------------------------------------------------------------- the demo's shape


@dataclass
class DemoShape:
    """What one real demo run wrote, as offsets from its first metrics line."""

    metrics: list[tuple[float, dict[str, Any]]]  # (offset_s, record)
    evals: list[tuple[float, dict[str, Any], str]]  # (offset_s, record, per-problem file path)
    rollout_lines: list[bytes]
    duration_s: float

    @classmethod
    def read(cls, run_dir: Path, max_duration_s: float | None = None) -> DemoShape:
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        t0 = float(records[0]["t"])
        metrics = [(float(r["t"]) - t0, r) for r in records]
        evals = []
        evals_file = run_dir / "evals.jsonl"
        if evals_file.exists():
            for line in evals_file.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    evals.append((float(record["t"]) - t0, record, str(run_dir / record.get("results_file", ""))))
        stream = run_dir / "stream" / "rollouts.jsonl"
        rollouts = stream.read_bytes().splitlines(keepends=True) if stream.exists() else []
        duration = metrics[-1][0]
        if max_duration_s is not None and max_duration_s < duration:
            rollouts = rollouts[: int(len(rollouts) * max_duration_s / duration)]
            metrics = [m for m in metrics if m[0] <= max_duration_s]
            evals = [e for e in evals if e[0] <= max_duration_s]
            duration = max_duration_s
        return cls(metrics, evals, rollouts, duration)

    def describe(self) -> str:
        points = sum(sum(1 for k, v in r.items() if k not in ("t", "step") and isinstance(v, (int, float))) for _, r in self.metrics)
        steps = max(int(r.get("step", 0)) for _, r in self.metrics) + 1
        return (f"{len(self.metrics)} metrics lines ({len(self.metrics) / self.duration_s:.2f} lines/s, {points / self.duration_s:.1f} points/s, "
                f"{steps} steps in {self.duration_s:.0f} s = {steps / self.duration_s:.2f} steps/s), {len(self.evals)} evals, "
                f"{len(self.rollout_lines)} rollout lines ({len(self.rollout_lines) / self.duration_s:.1f}/s) per run")


class ReplayWriter:
    """Appends a `DemoShape` to many run directories at once, each run started at its own offset
    (spread over `stagger_s`), on one thread. `written_lines()` counts metrics lines written."""

    def __init__(self, shape: DemoShape, run_dirs: list[Path], stagger_s: float = 1.0, with_rollouts: bool = True) -> None:
        self.shape = shape
        self.run_dirs = run_dirs
        self.stagger_s = stagger_s
        self.with_rollouts = with_rollouts
        self._written = 0
        self._thread: threading.Thread | None = None
        self.done = threading.Event()

    def written_lines(self) -> int:
        return self._written

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replay-writer", daemon=True)
        self._thread.start()

    def _events(self, start: float) -> list[tuple[float, int, int, str, Any]]:
        events: list[tuple[float, int, int, str, Any]] = []
        order = 0
        rng = random.Random(0)
        groups = [self.shape.rollout_lines[i:i + ROLLOUT_GROUP_LINES] for i in range(0, len(self.shape.rollout_lines), ROLLOUT_GROUP_LINES)]
        for index, _ in enumerate(self.run_dirs):
            base = start + rng.uniform(0, self.stagger_s)
            for offset, record in self.shape.metrics:
                events.append((base + offset, order, index, "metrics", record)); order += 1
            for offset, record, results in self.shape.evals:
                events.append((base + offset, order, index, "eval", (record, results))); order += 1
            if self.with_rollouts and groups:
                gap = self.shape.duration_s / len(groups)
                for g, group in enumerate(groups):
                    events.append((base + g * gap, order, index, "rollouts", b"".join(group))); order += 1
        heapq.heapify(events)
        return events

    def _run(self) -> None:
        handles: dict[tuple[int, str], Any] = {}

        def handle(index: int, name: str) -> Any:
            key = (index, name)
            if key not in handles:
                path = self.run_dirs[index] / name
                path.parent.mkdir(parents=True, exist_ok=True)
                handles[key] = open(path, "ab", buffering=0)
            return handles[key]

        events = self._events(time.time() + 0.5)
        while events:
            due, _, index, kind, payload = heapq.heappop(events)
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            if kind == "metrics":
                # `t` is the moment the line is written: what the push latency is measured from.
                handle(index, "metrics.jsonl").write((json.dumps({**payload, "t": time.time()}) + "\n").encode())
                self._written += 1
            elif kind == "eval":
                record, results = payload
                target = self.run_dirs[index] / record["results_file"]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(results, target)  # the per-problem file is written before its line
                handle(index, "evals.jsonl").write((json.dumps({**record, "t": time.time()}) + "\n").encode())
            else:
                handle(index, "stream/rollouts.jsonl").write(payload)
        for file in handles.values():
            file.close()
        self.done.set()


# --------------------------------------------------------------------------- ingest role


def _write_atomically(path: Path, text: str) -> None:
    """The bench reads the file while this process rewrites it: never a half-written one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_ingest(spec: dict[str, Any]) -> None:
    """Deliver every run of `spec["runs"]` through RunSupervisor.poll() + PlatformReporter until
    `spec["stop_file"]` exists and everything written is delivered; progress (metrics lines
    delivered) goes to `spec["progress_file"]` once a second."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")
    import django

    django.setup()
    from django.conf import settings

    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    from inflight.live import broadcast
    from inflight.live.broadcast import batch_points

    # Where a push's time goes: a line's stored-and-committed delay (from its `t`, the moment the
    # writer wrote it) is measured here; the rest of the push latency is the broadcast and the web node.
    ingest_delays_ms: list[float] = []
    ingest_written_at: list[float] = []  # each delay's line `t`: when in the replay ingest was slow

    # And where the ingest threads' time goes: each reporter call's duration by kind.
    call_ms: dict[str, list[float]] = {}

    def timed(kind: str, call: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            call_ms.setdefault(kind, []).append((time.perf_counter() - started) * 1000.0)

    class TimedReporter(PlatformReporter):
        def metrics(self, records: list[tuple[int, dict[str, Any]]]) -> Any:
            # Handed to the process's metrics writer (timed: the hand-over), settled on a later poll
            # (timed: the alert rules after it); a line's ingest delay ends when its statement did.
            delivery = timed("metrics", super().metrics, records)
            settle = delivery.settle

            def timed_settle() -> None:
                timed("metrics_settle", settle)
                stored_at = delivery.pending.stored_at or time.time()
                ingest_delays_ms.extend((stored_at - float(record.get("t", stored_at))) * 1000.0 for _, record in records)
                ingest_written_at.extend(float(record.get("t", stored_at)) for _, record in records)

            delivery.settle = timed_settle
            return delivery

        def evaluation(self, line_no: int, record: dict[str, Any], problem_rows: list[dict[str, Any]]) -> Any:
            # Handed to the process's evaluation writer (timed: the hand-over); `evaluations_written`: until stored.
            handed_at = time.perf_counter()
            delivery = timed("evaluation", super().evaluation, line_no, record, problem_rows)
            delivery.future.add_done_callback(
                lambda _: call_ms.setdefault("evaluations_written", []).append((time.perf_counter() - handed_at) * 1000.0))
            return delivery

        def rollouts(self, records: Any, lines_read: int) -> Any:
            # Handed to the process's rollout writer (timed: the hand-over); `rollouts_written`: from
            # the hand-over until the writer stored it (its queue included).
            handed_at = time.perf_counter()
            delivery = timed("rollouts", super().rollouts, records, lines_read)
            delivery.future.add_done_callback(
                lambda _: call_ms.setdefault("rollouts_written", []).append((time.perf_counter() - handed_at) * 1000.0))
            return delivery

        def cancel_requested(self) -> bool:
            return timed("cancel_flag", super().cancel_requested)

        def tick(self) -> None:
            timed("alert_tick", super().tick)

    # And how many runs each statement of the process's metrics writer carried.
    from inflight.live import ingest as live_ingest

    runs_per_write: list[int] = []
    write_guarded = live_ingest._write_guarded

    def counted_write(batches: list[Any]) -> None:
        runs_per_write.append(len(batches))
        write_guarded(batches)

    live_ingest._write_guarded = counted_write

    # And when each metrics push was in Redis (the channel layer's publish returned): from the line's `t`.
    published_ms: list[float] = []
    published_written_at: list[float] = []  # each batch's oldest line's `t`: the timeline's window
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    publish = layer.group_send

    sent_by_type: dict[str, list[int]] = {}  # push type -> [count, bytes of forwarded text]

    async def timed_group_send(group: str, message: dict[str, Any]) -> None:
        await publish(group, message)
        counts = sent_by_type.setdefault(str(message.get("type")), [0, 0])
        counts[0] += 1
        counts[1] += len(message.get("text", ""))
        if message.get("type") == "metrics.batch" and (points := batch_points(message)):
            written_at = min(float(point[2]) for point in points)
            published_ms.append((time.time() - written_at) * 1000.0)
            published_written_at.append(written_at)

    layer.group_send = timed_group_send

    supervisors = [
        RunSupervisor(run_dir=Path(run["run_dir"]), config_yaml=run["config_yaml"], command_prefix=[], reporter=TimedReporter(run["id"]), cwd=REPO_ROOT)
        for run in spec["runs"]
    ]
    unsent_max = 0
    from inflight.runs.services import record_heartbeat

    def beat() -> None:
        record_heartbeat(spec["worker"]["name"], hostname="127.0.0.1", queues=["cpu"], gpus=[], cpu_count=os.cpu_count() or 0,
                         pid=os.getpid(), incarnation=spec["worker"]["incarnation"])

    poll_s = settings.INFLIGHT_POLL_S
    stop_file = Path(spec["stop_file"])
    progress = Path(spec["progress_file"])

    def poll_loop(mine: list[RunSupervisor]) -> None:
        """Several runs' supervision rounds on one thread, as each run's own loop (RunSupervisor.supervise)
        would do them: a run is polled when the watch says it wrote a line, and every run every
        poll_s; rounds at least min_gap_s apart."""
        from django.db import connection

        from workers.run_dir_watch import RunDirWatch

        by_dir = {supervisor.run_dir: supervisor for supervisor in mine}
        min_gap_s = mine[0].min_gap_s if mine else 0.05
        with RunDirWatch() as watch:
            for supervisor in mine:
                watch.add(supervisor.run_dir)
            next_round = 0.0
            woken: set[Path] = set()
            while True:
                started = time.monotonic()
                every_run = started >= next_round
                if every_run:
                    next_round = started + poll_s
                due = mine if every_run else [by_dir[run_dir] for run_dir in woken]
                all_delivered = True
                for supervisor in due:
                    all_delivered = supervisor.poll() and all_delivered
                if every_run and stop_file.exists() and all_delivered:
                    break
                woken = watch.wait(next_round - time.monotonic())
                time.sleep(max(0.0, min_gap_s - (time.monotonic() - started)))
        connection.close()

    # Threads as a Celery worker's (-P threads): their database round trips overlap.
    threads = [threading.Thread(target=poll_loop, args=(supervisors[t::spec["threads"]],), daemon=True) for t in range(spec["threads"])]
    for thread in threads:
        thread.start()
    last_beat = 0.0
    while any(thread.is_alive() for thread in threads):
        now = time.monotonic()
        if now - last_beat >= settings.INFLIGHT_HEARTBEAT_INTERVAL_S:
            beat()
            last_beat = now
        unsent_max = max(unsent_max, broadcast._broadcaster._unsent)  # pushes queued for the channel layer
        _write_atomically(progress, json.dumps({"delivered_lines": sum(s.metrics_tail.line_no for s in supervisors)}))
        time.sleep(1.0)
    _write_atomically(progress, json.dumps({"delivered_lines": sum(s.metrics_tail.line_no for s in supervisors),
                                            "ingest_delays_ms": ingest_delays_ms, "ingest_written_at": ingest_written_at, "unsent_max": unsent_max,
                                            "call_ms": call_ms, "published_ms": published_ms, "published_written_at": published_written_at, "sent_by_type": sent_by_type,
                                            "runs_per_write": runs_per_write}))
    from inflight.live.broadcast import flush_broadcasts

    flush_broadcasts(300)  # a worker lives on and sends them all; this process must not end first


# --------------------------------------------------------------------------- clients role


HTTP_CONNECTIONS = 50  # the pages' HTTP connections to each web node


async def _run_clients(spec: dict[str, Any]) -> list[ClientRecord]:
    import httpx

    from run_page_client import ClientRecord, run_page_client  # tests/platform: the run page's subscription

    stop = asyncio.Event()
    stop_file = Path(spec["stop_file"])
    records = [ClientRecord(c["client"], c["run_id"]) for c in spec["clients"]]
    bases = sorted({base for c in spec["clients"] for base in c["bases"]})
    # The pages' HTTP requests share HTTP_CONNECTIONS connections per web node, as before, but each
    # connection is its own client (a page keeps to one): with all of them in one pool, httpx
    # scanned every queued request against every connection at each answer, a quarter of this
    # process's CPU (py-spy --gil), taken from the platform on the same cores.
    http_pools = [{base: httpx.AsyncClient(cookies={"sessionid": spec["cookie"]}, timeout=120, limits=httpx.Limits(max_connections=1))
                   for base in bases} for _ in range(HTTP_CONNECTIONS)]
    tasks = []
    for index, (record, client) in enumerate(zip(records, spec["clients"])):
        http_clients = http_pools[index % HTTP_CONNECTIONS]
        tasks.append(asyncio.ensure_future(run_page_client(record, client["bases"], spec["cookie"], stop, http_clients,
                                                                 panel_poll_s=spec.get("panel_poll_s", 0.0),
                                                                 watch_rollouts=client.get("watch_rollouts", False))))
        await asyncio.sleep(spec.get("connect_spacing_s", 0.01))  # pages are opened over a few seconds, not in one instant
    Path(spec["ready_file"]).write_text("ready")
    # How late this process's own event loop runs (a 50 ms sleep's overshoot, every 50 ms): the
    # pages' process shares the 2 cores with the platform, and a push it reads late counts in the
    # push latency although the web node sent it in time.
    lags_ms: list[tuple[float, float]] = []
    loop = asyncio.get_running_loop()
    while not stop_file.exists():
        for _ in range(4):
            asked = loop.time()
            await asyncio.sleep(0.05)
            lags_ms.append((time.time(), (loop.time() - asked - 0.05) * 1000.0))
    Path(spec["result_file"]).with_name(CLIENTS_LAG_FILE).write_text(json.dumps(lags_ms))
    stop.set()
    await asyncio.gather(*tasks)
    for pool in http_pools:
        for http in pool.values():
            await http.aclose()
    return records


def run_clients(spec: dict[str, Any]) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    records = asyncio.run(_run_clients(spec))
    Path(spec["result_file"]).write_text(json.dumps([record.__dict__ for record in records]))


if __name__ == "__main__":
    role, spec_path = sys.argv[1], sys.argv[2]
    spec = json.loads(Path(spec_path).read_text())
    {"ingest": run_ingest, "clients": run_clients}[role](spec)
