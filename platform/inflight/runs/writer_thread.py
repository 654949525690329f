"""A worker process's background writers: writes handed over by the run supervisors, done one
after another on a thread and database connection of their own.

At 200 live runs a supervisor thread that stored a poll's rollout rows or an evaluation itself
held back the metrics lines of every other run it polls (bench/RESULTS.md, 2026-11-29): now it
hands the write over (`WriterThread.submit`), goes on, and settles the returned future on a later
poll (`workers.tasks.FutureDelivery`). One thread per kind of write (`rollouts.services`,
`runs.evaluations`), so a slow kind never delays another. Metrics have their own writer, which
also gathers many runs' batches into one statement (`live.ingest.MetricsWriter`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Generic, TypeVar

from django.db import connection

logger = logging.getLogger(__name__)

T = TypeVar("T")


class WriterThread(Generic[T]):
    """Runs the writes submitted to it in order, on its own thread (started on first use, and again
    in a forked child: a thread does not survive a fork). A write's error is its future's: the
    supervisor raises it when settling and sends the same lines again.

    `defer_while`: writes that may lag (the rollout viewer's rows) wait while it says so — the
    process's metrics are late (`live.ingest.metrics_behind`) — but one goes at least every
    `defer_at_most_s`, so their pages still move. What waits stays in the run's own files: a run has
    one batch of a kind in flight, and its supervisor reads on once that one settles."""

    IDLE_CLOSE_S = 1.0  # its connection is closed after this long without a write
    DEFER_POLL_S = 0.02

    def __init__(self, name: str, defer_while: Callable[[], bool] | None = None, defer_at_most_s: float = 3.0) -> None:
        self.name = name
        self.defer_while = defer_while
        self.defer_at_most_s = defer_at_most_s
        self._queue: queue.SimpleQueue[tuple[Callable[[], T], Future[T]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pid = 0

    def submit(self, write: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        if connection.in_atomic_block:
            # Inside the caller's transaction (a test's): its own connection must write it, now.
            try:
                future.set_result(write())
            except BaseException as exc:  # noqa: BLE001 - the caller's settle raises it
                future.set_exception(exc)
            return future
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._queue = os.getpid(), queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._queue,), name=self.name, daemon=True).start()
            self._queue.put((write, future))
        return future

    def _run(self, waiting: queue.SimpleQueue[tuple[Callable[[], T], Future[T]]]) -> None:
        last_write_at = time.monotonic()
        while True:
            try:
                write, future = waiting.get(timeout=self.IDLE_CLOSE_S)
            except queue.Empty:
                connection.close()  # quiet: no connection held open for nothing
                write, future = waiting.get()
            if self.defer_while is not None:
                while self.defer_while() and time.monotonic() - last_write_at < self.defer_at_most_s:
                    time.sleep(self.DEFER_POLL_S)  # waiting takes neither a core nor the GIL nor the database
            try:
                future.set_result(write())
            except BaseException as exc:  # noqa: BLE001 - the supervisor's settle raises it; its lines come again
                connection.close()  # the next write reconnects
                logger.warning("%s: a write failed: %s", self.name, exc)
                future.set_exception(exc)
            finally:
                last_write_at = time.monotonic()
