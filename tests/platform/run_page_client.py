"""A run page's live subscription in Python, as static/inflight/run_page.js does it: open the run's
socket, fetch `snapshot.json` once it is open (pushes that come meanwhile wait), apply `metrics.batch`
pushes by seq (stale ones ignored, a gap refetches the snapshot), and after a close reconnect — to
the next web node, as a load balancer would send it — and refetch. The page's state is
`downsample_oracle.DownsampleState` (downsample.js's State), applied once the page stops (`PageSeries`).
Used by tests/platform/test_two_web_nodes.py
and bench/platform_scale.py; it counts what the lost-nothing property is about. With `panel_poll_s`
it also refreshes the actions panel as the page does: `panel.json` on a `run.panel` push, an
`eval.score` push or a held-out success point at a listed checkpoint's step, a status change and
each reconnect (debounced and spread over 0.5-2 s), and on a slow safety poll; once at the first
connect too, standing in for the page's own render (which carries the panel and its checkpoints).
With `watch_rollouts` the page shows its Rollouts tab, as rollouts.js: it asks the socket for the
run's rollout rows on every connect, loads the stored rows (`rollouts.json`) when the socket answers
that they come, and asks for the counts again (`rollouts/counts.json`) at most every
ROLLOUT_COUNTS_EVERY_S while rows arrive.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from downsample_oracle import DownsampleState  # tests/platform is on sys.path (as for the test modules)


class PageSeries:
    """The page's series as the snapshot it loaded plus the pushes it took after it, decided by seq
    as `DownsampleState.apply_batch` decides (stale, gap, applied) but folded into a
    `DownsampleState` only when `final()` is asked: the bench's 500 pages share the machine with the
    platform they measure, and folding every point as it came was a quarter of their process's CPU
    (py-spy --gil), work a browser does on its own machine. The outcome is the same state.

    The snapshot and the pushes are kept as the text they came as, parsed again at `final()`: kept
    parsed, the 500 pages' points were ~2 million objects in one process by the replay's end, and
    each full collection of its cyclic garbage collector walked them all, 0.4-1.4 s during which no
    page read its socket; those stalls were most of the push p95 bench/platform_scale.py measured
    (bench/RESULTS.md, 2026-11-29). A browser collects each page's own small heap."""

    def __init__(self, snapshot_text: bytes | str) -> None:
        self.snapshot_text = snapshot_text
        self.seq = int(_json(snapshot_text)["seq"])
        self.pushes: list[bytes | str] = []  # the applied pushes' text

    def apply_batch(self, message: dict[str, Any], text: bytes | str) -> str:
        """`message`: a `metrics.batch` push as parsed from `text`."""
        seq = int(message["seq"])
        if seq <= self.seq:
            return "stale"
        if int(message.get("from_seq", seq)) > self.seq + 1:
            return "gap"
        self.pushes.append(text)
        self.seq = seq
        return "applied"

    def final(self) -> dict[str, Any]:
        state = DownsampleState.from_snapshot(_json(self.snapshot_text))
        for text in self.pushes:
            outcome = state.apply_batch(_json(text))
            assert outcome == "applied", outcome  # decided as above, by the same seqs
        return state.to_snapshot()


@dataclass
class ClientRecord:
    """What one page saw; the bench compares `final` with the run's metrics.jsonl."""

    client: int
    run_id: int
    latencies_ms: list[float] = field(default_factory=list)
    written_at: list[float] = field(default_factory=list)  # the line's `t` of each latency: when in the run it was slow
    pushes: int = 0
    gaps: int = 0  # a push left a batch out (the page refetched)
    duplicates_or_out_of_order: int = 0  # a push on one connection not after the previous one
    refetches: int = 0
    connects: int = 0
    errors: list[str] = field(default_factory=list)
    final: dict[str, Any] | None = None
    seq: int = 0  # the batches the page holds (1..seq), kept up to date
    panel_ms: list[float] = field(default_factory=list)  # panel.json answers (`panel_poll_s`), how long each took
    panel_errors: int = 0
    panel_pushes: int = 0  # `run.panel` pushes received
    rollout_rows: int = 0  # rows of `rollouts.batch` pushes received (`watch_rollouts`)
    rollouts_ms: list[float] = field(default_factory=list)  # rollouts.json answers (`watch_rollouts`), how long each took
    rollouts_errors: int = 0


async def _fetch_snapshot(http: Any, base: str, run_id: int) -> PageSeries:
    """The page's series from the run's snapshot.json (a body that is not JSON fails the fetch)."""
    response = await http.get(f"{base}/runs/{run_id}/snapshot.json")
    response.raise_for_status()
    return PageSeries(response.content)


def _json(body: bytes | str) -> Any:
    """An answer's JSON, read as a browser's native JSON.parse would (orjson; the json module only
    for what orjson refuses)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


async def _close_when(stop: asyncio.Event, socket: Any) -> None:
    """Close the page's socket once the bench stops (its reading loop then ends)."""
    await stop.wait()
    await socket.close()


TERMINAL = ("succeeded", "failed", "cancelled", "lost")
# As run_page.js: pushes within PANEL_DEBOUNCE_S cause one fetch; the safety poll (for a dropped push)
# comes every `panel_poll_s` (60 s there) while the run is active, SAFETY_POLL_ENDED_S once it ended,
# each ±10 %.
PANEL_DEBOUNCE_S = 0.5
PANEL_SPREAD_S = 1.5
SAFETY_POLL_ENDED_S = 300.0
PANEL_RETRY_S = 15.0


@dataclass
class PanelWanted:
    """What the socket side tells the panel side: a push asked for a fetch (`event`), and the status
    the page shows (from `run.status` pushes and panel answers)."""

    event: asyncio.Event = field(default_factory=asyncio.Event)
    status: str = ""
    checkpoint_steps: set[int] = field(default_factory=set)  # the steps the panel lists (`data-step` rows)

    def ask(self) -> None:
        self.event.set()


async def _refresh_panel(record: ClientRecord, current_base: list[str], stop: asyncio.Event, http_clients: dict[str, Any],
                         every_s: float, wanted: PanelWanted) -> None:
    """As run_page.js: `runs/<id>/panel.json` when a push or a (re)connect asks (`wanted`), at most
    once per PANEL_DEBOUNCE_S, else on the safety poll; from the node the page is on."""
    delay = every_s * random.uniform(0.9, 1.1)
    while not stop.is_set():
        stop_task = asyncio.ensure_future(stop.wait())
        wanted_task = asyncio.ensure_future(wanted.event.wait())
        done, pending = await asyncio.wait({stop_task, wanted_task}, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if stop_task in done:
            return
        if wanted_task in done:
            await asyncio.sleep(PANEL_DEBOUNCE_S + PANEL_SPREAD_S * random.random())  # the pushes that come meanwhile ride on this fetch
        wanted.event.clear()
        base = current_base[0]
        started = time.monotonic()
        try:
            response = await http_clients[base].get(f"{base}/runs/{record.run_id}/panel.json", headers={"Accept": "application/json"})
            response.raise_for_status()
            record.panel_ms.append((time.monotonic() - started) * 1000.0)
            answer = _json(response.content)
            wanted.status = str(answer.get("status") or wanted.status)
            wanted.checkpoint_steps = {int(step) for step in re.findall(r'data-step="(\d+)"', answer.get("actions_html") or "")}
            delay = (every_s if wanted.status not in TERMINAL else SAFETY_POLL_ENDED_S) * random.uniform(0.9, 1.1)
        except Exception:  # noqa: BLE001 - as the page: it tries again a little later
            record.panel_errors += 1
            delay = PANEL_RETRY_S


# As rollouts.js: the counts are asked again at most this often while pushed rows arrive.
ROLLOUT_COUNTS_EVERY_S = 3.0


async def _load_rollouts(record: ClientRecord, http: Any, base: str, delay_s: float = 0.0, counts_only: bool = False) -> None:
    """The Rollouts tab's first page of stored rows (with its counts), or its counts alone, as
    rollouts.js asks for them."""
    await asyncio.sleep(delay_s)
    started = time.monotonic()
    path = "rollouts/counts.json" if counts_only else "rollouts.json"
    try:
        response = await http.get(f"{base}/runs/{record.run_id}/{path}", headers={"Accept": "application/json"})
        response.raise_for_status()
        _json(response.content)
        record.rollouts_ms.append((time.monotonic() - started) * 1000.0)
    except Exception:  # noqa: BLE001 - as the page: the next batch or connect asks again
        record.rollouts_errors += 1


async def run_page_client(record: ClientRecord, bases: list[str], cookie: str, stop: asyncio.Event, http_clients: dict[str, Any],
                          panel_poll_s: float = 0.0, watch_rollouts: bool = False) -> None:
    """`panel_poll_s` > 0: also refresh the actions panel as the page does (run_page.js: on pushes, on
    each connect, and a safety poll this often while the run is active). `watch_rollouts`: the page
    shows its Rollouts tab (it gets the run's rollout rows and asks for the stored ones)."""
    import websockets

    state: PageSeries | None = None
    node = 0
    current_base = [bases[0]]
    wanted = PanelWanted()
    panel = asyncio.ensure_future(_refresh_panel(record, current_base, stop, http_clients, panel_poll_s, wanted)) if panel_poll_s > 0 else None
    rollout_loads: set[asyncio.Task[None]] = set()
    counts_task: asyncio.Task[None] | None = None
    while not stop.is_set():
        base = bases[node % len(bases)]
        current_base[0] = base
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
                if watch_rollouts:
                    await socket.send('{"type":"watch","rollouts":true}')
                # As run_page.js: the snapshot is fetched once the socket is open; pushes that come
                # meanwhile wait and are applied after it. The panel is asked again too (on the first
                # connect, in place of the page's render). The fetch and the stop are callbacks, not
                # awaited beside each message: an asyncio.wait per message was a tenth of the 500
                # pages' process (py-spy --gil), CPU taken from the platform on the same cores.
                wanted.ask()
                http = http_clients[base]
                buffered: list[tuple[float, dict[str, Any], bytes | str]] = []
                fetching: list[asyncio.Task[PageSeries]] = []  # the snapshot fetch under way, if any

                def fetch_snapshot() -> None:
                    task = asyncio.ensure_future(_fetch_snapshot(http, base, record.run_id))
                    fetching.append(task)
                    task.add_done_callback(snapshot_fetched)

                def snapshot_fetched(task: asyncio.Task[PageSeries]) -> None:
                    nonlocal state
                    fetching.remove(task)
                    if task.cancelled():
                        return
                    if task.exception() is not None:
                        record.errors.append(f"snapshot: {type(task.exception()).__name__}: {str(task.exception())[:120]}")
                        asyncio.ensure_future(socket.close())  # as a failed page: reconnect and fetch again
                        return
                    state = task.result()
                    record.seq = state.seq
                    record.refetches += 1
                    pending = buffered[:]
                    buffered.clear()
                    for received_at, message, text in pending:
                        if _apply(record, state, message, text, received_at) == "gap":
                            record.gaps += 1
                            fetch_snapshot()  # what is left of the buffer is in that snapshot
                            break

                fetch_snapshot()
                closer = asyncio.ensure_future(_close_when(stop, socket))
                try:
                    async for raw in socket:
                        received_at = time.time()
                        # orjson: a browser's JSON.parse is native code too; with the json module the 500 pages of
                        # bench/platform_scale.py, in one process beside the platform, spent a fifth of it parsing.
                        message = orjson.loads(raw)
                        kind = message.get("type")
                        if kind == "rollouts.batch":
                            record.rollout_rows += len(message.get("rows") or ())
                            if counts_task is None or counts_task.done():
                                counts_task = asyncio.ensure_future(_load_rollouts(record, http, base, ROLLOUT_COUNTS_EVERY_S, counts_only=True))
                        elif kind == "watching" and message.get("rollouts"):
                            load = asyncio.ensure_future(_load_rollouts(record, http, base))
                            rollout_loads.add(load)
                            load.add_done_callback(rollout_loads.discard)
                        elif kind == "error":
                            record.errors.append(f"socket answered {message!r}")
                        elif kind == "run.panel":
                            record.panel_pushes += 1
                            wanted.ask()
                        elif kind == "eval.score":
                            if int(message.get("step", -1)) in wanted.checkpoint_steps:
                                wanted.ask()
                        elif kind == "run.status":
                            if message.get("status") != wanted.status:
                                wanted.status = str(message.get("status"))
                                wanted.ask()
                        if kind != "metrics.batch":
                            continue
                        if any(point[0] == "success/heldout" and int(point[1]) in wanted.checkpoint_steps for point in message["points"]):
                            wanted.ask()
                        record.pushes += 1
                        seq, first = int(message["seq"]), int(message.get("from_seq", message["seq"]))
                        if last_seq_on_connection is not None and first <= last_seq_on_connection:
                            record.duplicates_or_out_of_order += 1
                        last_seq_on_connection = max(seq, last_seq_on_connection or 0)
                        if fetching:
                            buffered.append((received_at, message, raw))
                        elif _apply(record, state, message, raw, received_at) == "gap":
                            record.gaps += 1
                            fetch_snapshot()
                finally:
                    closer.cancel()
                    for task in fetching[:]:
                        task.cancel()
                if stop.is_set():
                    break
                record.errors.append(f"ConnectionClosed: the server closed the socket ({socket.close_code})")
        except Exception as exc:  # noqa: BLE001 - a closed or refused socket: reconnect as the page does
            record.errors.append(f"{type(exc).__name__}: {str(exc)[:120]}")
        if stop.is_set():
            break
        node += 1  # the next node, as a load balancer sends a client whose node went away
        await asyncio.sleep(1.0 + random.random() * 0.5)
    if panel is not None:
        await panel
    for task in [*rollout_loads, *([counts_task] if counts_task is not None else [])]:
        task.cancel()
    record.final = state.final() if state is not None else None


def _apply(record: ClientRecord, state: PageSeries, message: dict[str, Any], text: bytes | str, received_at: float) -> str:
    outcome = state.apply_batch(message, text)
    record.seq = state.seq
    if outcome == "applied":
        for t in {point[2] for point in message["points"]}:
            record.latencies_ms.append((received_at - float(t)) * 1000.0)
            record.written_at.append(float(t))
    return outcome
