"""Pushes to the live Channels groups, off the write path: a run's group and a user's run list,
and the background event loop that sends them (services call `_group_send` inside their
transactions' on_commit; `flush_broadcasts` waits for the queue to drain)."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


def user_runs_group(user_id: int) -> str:
    return f"runs-user-{user_id}"


class _Broadcaster:
    """Channels sends from sync code: in order, on one event loop thread per process, and
    without making the caller wait for Redis.

    `async_to_sync(layer.group_send)` would run each send on a fresh event loop, and the Redis
    layer keeps its connections per loop, so every push would open a new connection (~7 ms vs
    <1 ms here). Ingest only queues its push (after its transaction committed) and returns: a
    2,000-point push costs a few ms of serialization and Redis round trips that need not delay
    the next batch. One task sends the queue in order, so a client never sees batch 5 before
    batch 4. If Redis stalls and more than `MAX_UNSENT` pushes wait, new ones are dropped
    (logged): the database holds the data and a client that sees the seq gap refetches its
    snapshot. Recreated after a fork (the loop thread does not survive it)."""

    MAX_UNSENT = 1000
    SEND_TIMEOUT_S = 5.0

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self._pid = 0
        self._unsent = 0

    def _started_loop(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, dict[str, Any]]]]:
        # Called with the lock held.
        if self._loop is None or self._queue is None or self._pid != os.getpid():
            loop = asyncio.new_event_loop()
            queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
            self._loop, self._queue, self._pid, self._unsent = loop, queue, os.getpid(), 0
            threading.Thread(target=loop.run_forever, name="inflight-broadcast", daemon=True).start()
            asyncio.run_coroutine_threadsafe(self._send_in_order(queue), loop)
        return self._loop, self._queue

    def send(self, group: str, message: dict[str, Any]) -> None:
        """Queue one group_send; returns at once."""
        with self._lock:
            if self._unsent >= self.MAX_UNSENT:
                logger.warning("%d pushes waiting for the channel layer; dropping %s to %s", self._unsent, message.get("type"), group)
                return
            loop, queue = self._started_loop()
            self._unsent += 1
        loop.call_soon_threadsafe(queue.put_nowait, (group, message))

    async def _send_in_order(self, queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        while True:
            group, message = await queue.get()
            try:
                layer = get_channel_layer()
                if layer is not None:
                    await asyncio.wait_for(layer.group_send(group, message), self.SEND_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a live push must never undo or block a recorded write
                logger.warning("could not broadcast %s to %s", message.get("type"), group, exc_info=True)
            finally:
                with self._lock:
                    self._unsent -= 1
                    self._lock.notify_all()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued push was handed to the channel layer (or failed); False on timeout."""
        with self._lock:
            if self._pid != os.getpid():
                return True
            return self._lock.wait_for(lambda: self._unsent == 0, timeout_s)


_broadcaster = _Broadcaster()
# A short-lived process (a management command, a bench) still delivers its last pushes.
atexit.register(_broadcaster.flush)


def _group_send(group: str, message: dict[str, Any]) -> None:
    try:
        _broadcaster.send(group, message)
    except Exception:  # noqa: BLE001 - a live push must never undo or block a recorded write
        logger.warning("could not broadcast %s to %s", message.get("type"), group, exc_info=True)


def flush_broadcasts(timeout_s: float = 5.0) -> bool:
    """Block until this process's queued live pushes were sent; False if they did not go in time."""
    return _broadcaster.flush(timeout_s)

