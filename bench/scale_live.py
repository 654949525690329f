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
  (its `deliver()`: the file tails, supersede checks, eval and rollout delivery) with the real
  `workers.tasks.PlatformReporter` (services.ingest_metrics → folding → broadcast to the Redis
  channel layer, alert rules, rollout ingest), polled every INFLIGHT_POLL_S (250 ms) as a
  supervisor polls — one process drives many runs, where production has one Celery thread each;
- clients are real WebSocket clients (the `websockets` library) on Daphne, subscribed as the run page
  is: connect, fetch `snapshot.json`, apply `metrics.batch` pushes by seq (stale ignored, a gap
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT / "platform", REPO_ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

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


def run_ingest(spec: dict[str, Any]) -> None:
    """Deliver every run of `spec["runs"]` through RunSupervisor.deliver() + PlatformReporter until
    `spec["stop_file"]` exists and everything written is delivered; progress (metrics lines
    delivered) goes to `spec["progress_file"]` once a second."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")
    import django

    django.setup()
    from django.conf import settings

    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    supervisors = [
        RunSupervisor(run_dir=Path(run["run_dir"]), config_yaml=run["config_yaml"], command_prefix=[], reporter=PlatformReporter(run["id"]), cwd=REPO_ROOT)
        for run in spec["runs"]
    ]
    poll_s = settings.INFLIGHT_POLL_S
    stop_file = Path(spec["stop_file"])
    progress = Path(spec["progress_file"])
    last_progress = 0.0
    while True:
        started = time.monotonic()
        all_delivered = True
        for supervisor in supervisors:
            all_delivered = supervisor.deliver() and all_delivered
            supervisor.tick()
        now = time.monotonic()
        if now - last_progress >= 1.0:
            delivered = sum(s.metrics_tail.line_no for s in supervisors)
            progress.write_text(json.dumps({"delivered_lines": delivered, "loop_s": now - started}))
            last_progress = now
        if stop_file.exists() and all_delivered:
            break
        time.sleep(max(0.0, poll_s - (time.monotonic() - started)))
    progress.write_text(json.dumps({"delivered_lines": sum(s.metrics_tail.line_no for s in supervisors), "loop_s": 0.0}))
    from inflight.runs.services import flush_broadcasts

    flush_broadcasts(30)


# --------------------------------------------------------------------------- clients role


@dataclass
class ClientRecord:
    """What one page saw; the bench compares `final` with the run's metrics.jsonl."""

    client: int
    run_id: int
    latencies_ms: list[float] = field(default_factory=list)
    pushes: int = 0
    gaps: int = 0  # a push left a batch out (the page refetched)
    duplicates_or_out_of_order: int = 0  # a push on one connection not after the previous one
    refetches: int = 0
    connects: int = 0
    errors: list[str] = field(default_factory=list)
    final: dict[str, Any] | None = None


async def _fetch_snapshot(http: Any, base: str, run_id: int) -> dict[str, Any]:
    response = await http.get(f"{base}/runs/{run_id}/snapshot.json")
    response.raise_for_status()
    return response.json()


async def run_page_client(record: ClientRecord, bases: list[str], cookie: str, stop: asyncio.Event, http_clients: dict[str, Any]) -> None:
    import websockets

    from tests.platform.downsample_oracle import DownsampleState

    state: DownsampleState | None = None
    node = 0
    while not stop.is_set():
        base = bases[node % len(bases)]
        ws_url = base.replace("http://", "ws://") + f"/ws/runs/{record.run_id}/"
        last_seq_on_connection: int | None = None
        try:
            async with websockets.connect(ws_url, origin=base, additional_headers={"Cookie": f"sessionid={cookie}"},
                                          open_timeout=60, ping_interval=None, max_size=None) as socket:
                record.connects += 1
                hello = json.loads(await socket.recv())
                if hello.get("type") != "hello":
                    record.errors.append(f"first message {hello!r}")
                    return
                # As run_page.js: the snapshot is fetched once the socket is open; pushes that come
                # meanwhile wait and are applied after it.
                snapshot_task = asyncio.ensure_future(_fetch_snapshot(http_clients[base], base, record.run_id))
                buffered: list[tuple[float, dict[str, Any]]] = []
                stop_task = asyncio.ensure_future(stop.wait())
                recv_task = asyncio.ensure_future(socket.recv())
                while True:
                    waiting = {recv_task, stop_task} | ({snapshot_task} if snapshot_task is not None else set())
                    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    if snapshot_task is not None and snapshot_task in done:
                        state = DownsampleState.from_snapshot(snapshot_task.result())
                        record.refetches += 1
                        snapshot_task = None
                        for received_at, message in buffered:
                            if _apply(record, state, message, received_at) == "gap":
                                record.gaps += 1
                                snapshot_task = asyncio.ensure_future(_fetch_snapshot(http_clients[base], base, record.run_id))
                                break
                        buffered = []
                    if stop_task in done:
                        recv_task.cancel()
                        break
                    if recv_task in done and recv_task.exception() is not None:
                        stop_task.cancel()
                        raise recv_task.exception()
                    if recv_task not in done:
                        continue
                    received_at = time.time()
                    raw = recv_task.result()
                    recv_task = asyncio.ensure_future(socket.recv())
                    message = json.loads(raw)
                    if message.get("type") != "metrics.batch":
                        continue
                    record.pushes += 1
                    seq, first = int(message["seq"]), int(message.get("from_seq", message["seq"]))
                    if last_seq_on_connection is not None and first <= last_seq_on_connection:
                        record.duplicates_or_out_of_order += 1
                    last_seq_on_connection = max(seq, last_seq_on_connection or 0)
                    if snapshot_task is not None:
                        buffered.append((received_at, message))
                    elif _apply(record, state, message, received_at) == "gap":
                        record.gaps += 1
                        snapshot_task = asyncio.ensure_future(_fetch_snapshot(http_clients[base], base, record.run_id))
                if stop.is_set():
                    break
        except Exception as exc:  # noqa: BLE001 - a closed or refused socket: reconnect as the page does
            record.errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
        if stop.is_set():
            break
        node += 1  # the next node, as a load balancer sends a client whose node went away
        await asyncio.sleep(1.0 + random.random() * 0.5)
    record.final = state.to_snapshot() if state is not None else None


def _apply(record: ClientRecord, state: Any, message: dict[str, Any], received_at: float) -> str:
    outcome = state.apply_batch(message)
    if outcome == "applied":
        for t in {point[2] for point in message["points"]}:
            record.latencies_ms.append((received_at - float(t)) * 1000.0)
    return outcome


async def _run_clients(spec: dict[str, Any]) -> list[ClientRecord]:
    import httpx

    stop = asyncio.Event()
    stop_file = Path(spec["stop_file"])
    records = [ClientRecord(c["client"], c["run_id"]) for c in spec["clients"]]
    bases = sorted({base for c in spec["clients"] for base in c["bases"]})
    limits = httpx.Limits(max_connections=50)
    http_clients = {base: httpx.AsyncClient(cookies={"sessionid": spec["cookie"]}, timeout=120, limits=limits) for base in bases}
    tasks = []
    for record, client in zip(records, spec["clients"]):
        tasks.append(asyncio.ensure_future(run_page_client(record, client["bases"], spec["cookie"], stop, http_clients)))
        await asyncio.sleep(spec.get("connect_spacing_s", 0.01))  # pages are opened over a few seconds, not in one instant
    Path(spec["ready_file"]).write_text("ready")
    while not stop_file.exists():
        await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*tasks)
    for http in http_clients.values():
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
