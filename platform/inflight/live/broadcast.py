"""Pushes to the live Channels groups, off the write path: a run's group and a user's run list,
and the background event loop that sends them. The one way out for every writer: `push` (queue a
push now) and `push_on_commit` (queue it once the caller's transaction committed, so a page never
hears of a row it cannot read yet); `flush_broadcasts` waits for the queue to drain."""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import os
import threading
from typing import Any

import orjson
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def run_rollouts_group(run_id: int) -> str:
    """The pages of a run whose Rollouts tab is shown (`live/consumers.py` adds a page when it asks):
    `rollouts.batch` rows go only there, not to every open page of the run."""
    return f"run-{run_id}-rollouts"


def user_runs_group(user_id: int) -> str:
    return f"runs-user-{user_id}"


class _Broadcaster:
    """Channels sends from sync code: in order per group, on one event loop thread per process, and
    without making the caller wait for Redis.

    `async_to_sync(layer.group_send)` would run each send on a fresh event loop, and the Redis
    layer keeps its connections per loop, so every push would open a new connection (~7 ms vs
    <1 ms here). Ingest only queues its push (after its transaction committed) and returns: a
    2,000-point push costs a few ms of serialization and Redis round trips that need not delay
    the next batch. Each group's pushes are sent in order (a client never sees batch 5 before
    batch 4), one at a time; different groups' sends overlap, up to `MAX_IN_FLIGHT` at once: a
    worker ingesting many runs sent everything one round trip after another, and at 200 live runs
    its queue grew by the second (pushes a minute late, the last ones never sent before the process
    ended; bench/platform_scale.py). If Redis stalls and more than `MAX_UNSENT` pushes wait, new
    ones are dropped (logged): the database holds the data and a client that sees the seq gap
    refetches its snapshot. Recreated after a fork (the loop thread does not survive it)."""

    MAX_UNSENT = 1000
    MAX_IN_FLIGHT = 32
    SEND_TIMEOUT_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._unsent = 0
        # Loop-thread state: each group's waiting pushes, and the groups whose sender runs.
        self._waiting: dict[str, collections.deque[dict[str, Any]]] = {}
        self._slots: asyncio.Semaphore | None = None

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        # Called with the lock held.
        if self._loop is None or self._pid != os.getpid():
            loop = asyncio.new_event_loop()
            self._loop, self._pid, self._unsent, self._waiting = loop, os.getpid(), 0, {}
            self._slots = None
            threading.Thread(target=loop.run_forever, name="inflight-broadcast", daemon=True).start()
        return self._loop

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Queue one group_send; returns at once."""
        with self._lock:
            if self._unsent >= self.MAX_UNSENT:
                logger.warning("%d pushes waiting for the channel layer; dropping %s to %s", self._unsent, message.get("type"), group)
                return
            loop = self._started_loop()
            self._unsent += 1
        loop.call_soon_threadsafe(self._enqueue, group, message)

    def _enqueue(self, group: str, message: dict[str, Any]) -> None:
        # On the loop thread: a group with pushes waiting already has its sender running.
        waiting = self._waiting.get(group)
        if waiting is not None:
            waiting.append(message)
            return
        self._waiting[group] = collections.deque([message])
        asyncio.ensure_future(self._send_group(group))

    async def _send_group(self, group: str) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.MAX_IN_FLIGHT)
        async with self._slots:
            waiting = self._waiting[group]
            while waiting:
                # A run's consecutive metrics batches waiting here go as one push (as the consumer
                # coalesces them): when the channel layer is slower than ingest (200 live runs), each
                # would otherwise cost its own round trip and reach the pages later still.
                run = [waiting.popleft()]
                while waiting and _consecutive_batches(run[-1], waiting[0]):
                    run.append(waiting.popleft())
                message, merged = (join_batches(run) if len(run) > 1 else run[0]), len(run) - 1
                try:
                    layer = get_channel_layer()
                    if layer is not None:
                        await asyncio.wait_for(layer.group_send(group, message), self.SEND_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - a live push must never undo or block a recorded write
                    logger.warning("could not broadcast %s to %s", message.get("type"), group, exc_info=True)
                finally:
                    with self._lock:
                        self._unsent -= 1 + merged
                        self._lock.notify_all()
            del self._waiting[group]

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued push was handed to the channel layer (or failed); False on timeout."""
        with self._lock:
            if self._pid != os.getpid():
                return True
            return self._lock.wait_for(lambda: self._unsent == 0, timeout_s)


def metrics_batch(seq: int, points: list[list[Any]]) -> dict[str, Any]:
    """The `metrics.batch` push of a run's batch `seq`: its points ([name, step, t, value] each)
    as JSON text, made once here. Every open page of the run gets them: as structures they were
    packed for Redis here, unpacked and encoded to JSON again by the web node once per page (at 200
    live runs with 500 pages, 40% of the web node's event loop, bench/platform_scale.py, py-spy);
    as text the web node only joins consecutive batches' texts (`join_batches`)."""
    return {"type": "metrics.batch", "seq": int(seq), "points_json": orjson.dumps(points).decode()}


def batch_points(message: dict[str, Any]) -> list[list[Any]]:
    """The points of a `metrics.batch` push as sent to the channel layer (for the few readers that
    look inside one: tests, benches)."""
    return orjson.loads(message["points_json"]) if "points_json" in message else list(message.get("points") or [])


def _points_text(message: dict[str, Any]) -> str:
    """The points of a batch as JSON array text (one sent as structures before `metrics_batch`
    existed is encoded here)."""
    text = message.get("points_json")
    return text if isinstance(text, str) else orjson.dumps(list(message.get("points") or [])).decode()


def join_batches(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """One `metrics.batch` for consecutive batches (`from_seq` of the first .. `seq` of the last):
    their point arrays' texts joined, nothing decoded."""
    inner = [text[1:-1] for text in (_points_text(batch) for batch in batches) if text not in ("[]", "")]
    first = batches[0]
    return {"type": "metrics.batch", "from_seq": int(first.get("from_seq", first["seq"])), "seq": int(batches[-1]["seq"]),
            "points_json": "[" + ",".join(inner) + "]"}


def batch_text(message: dict[str, Any]) -> str:
    """A `metrics.batch` as the page receives it: `{"type", "from_seq", "seq", "points"}`."""
    return (f'{{"type":"metrics.batch","from_seq":{int(message.get("from_seq", message["seq"]))},'
            f'"seq":{int(message["seq"])},"points":{_points_text(message)}}}')


def _consecutive_batches(first: dict[str, Any], then: dict[str, Any]) -> bool:
    """Two `metrics.batch` pushes of a group where the second starts right after the first."""
    return (
        first.get("type") == then.get("type") == "metrics.batch"
        and all(isinstance(m.get("points_json"), str) or isinstance(m.get("points"), list) for m in (first, then))
        and int(then.get("from_seq", then["seq"])) == int(first["seq"]) + 1
    )


_broadcaster = _Broadcaster()
# A short-lived process (a management command, a bench) still delivers its last pushes.
atexit.register(_broadcaster.flush)


# Pushes a run page receives exactly as they were sent (live/consumers.py forwards them): their JSON
# text is made once here, not once for every open page. A 100-row rollouts.batch to the 500 pages
# of a lab's runs was encoded 500 times by the web node (and decoded from the channel layer as
# many times) just when every run's evaluation and rollouts arrived together: seconds of delay
# for the metric pushes behind them (bench/platform_scale.py). Pushes a consumer reads keep their
# structure (run.status, alert.fired); metrics.batch, which it merges, carries its points as text
# (`metrics_batch`).
FORWARDED_AS_TEXT = frozenset({"eval.score", "rollouts.batch", "run.panel"})


def push(group: str, message: dict[str, Any]) -> None:
    """Queue one push to `group` (in order per group) and return at once; a failure is logged,
    never raised: the database holds the data and a client refetches on a seq gap."""
    try:
        if message.get("type") in FORWARDED_AS_TEXT:
            # OPT_NON_STR_KEYS: an int key is written as a string, as json.dumps writes it.
            message = {"type": message["type"], "text": orjson.dumps(message, option=orjson.OPT_NON_STR_KEYS).decode()}
        _broadcaster.send(group, message)
    except Exception:  # noqa: BLE001 - a live push must never undo or block a recorded write
        logger.warning("could not broadcast %s to %s", message.get("type"), group, exc_info=True)


def push_on_commit(group: str, message: dict[str, Any]) -> None:
    """`push` once the current transaction commits (at once outside one); nothing if it rolls back."""
    transaction.on_commit(lambda: push(group, message))


def flush_broadcasts(timeout_s: float = 5.0) -> bool:
    """Block until this process's queued live pushes were sent; False if they did not go in time."""
    return _broadcaster.flush(timeout_s)

