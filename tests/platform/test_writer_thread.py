"""A worker's writer threads (`runs.writer_thread`): writes in order, off the supervisor's thread;
the rollout viewer's rows wait while the process's metrics are behind (`live.ingest.metrics_behind`),
one still going at least every `defer_at_most_s`."""

from __future__ import annotations

import threading
import time

from inflight.live.ingest import metrics_behind
from inflight.runs.writer_thread import WriterThread


def test_writes_wait_while_told_to_yet_one_goes_every_bound_and_all_go_once_told_no_longer() -> None:
    behind = threading.Event()
    behind.set()
    writer: WriterThread[float] = WriterThread("test-deferring-writer", defer_while=behind.is_set, defer_at_most_s=1.5)
    handed_at = time.monotonic()
    while_behind = [writer.submit(time.monotonic) for _ in range(3)]
    written = [future.result(timeout=30) for future in while_behind]
    assert written[0] - handed_at >= 1.45  # the thread started with a write's bound to wait out
    assert [later - earlier >= 1.45 for earlier, later in zip(written, written[1:])] == [True, True]
    queued = [writer.submit(time.monotonic) for _ in range(3)]
    behind.clear()
    cleared_at = time.monotonic()
    on_time = [future.result(timeout=30) for future in queued]
    assert on_time == sorted(on_time) and on_time[-1] - cleared_at < 1.0  # no bound waited out once on time


def test_a_writer_told_nothing_writes_at_once_in_order() -> None:
    writer: WriterThread[int] = WriterThread("test-writer")
    results: list[int] = []
    futures = [writer.submit(lambda n=n: results.append(n) or n) for n in range(5)]
    assert [future.result(timeout=30) for future in futures] == list(range(5)) and results == list(range(5))


def test_the_rollout_viewers_rows_are_the_writes_that_wait_for_the_metrics() -> None:
    from inflight.rollouts import services as rollout_services
    from inflight.runs import evaluations

    assert rollout_services._writer.defer_while is metrics_behind
    assert evaluations._writer.defer_while is None  # an evaluation's score is pushed to its pages: it does not wait
