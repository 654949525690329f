"""Who marks runs `lost`, and when it may: a sweep that any long-lived process runs.

`services.mark_lost_runs` judges a worker process by the age of its last heartbeat. That is
only fair from a process whose own database access has worked for at least the lost threshold:
after a PostgreSQL outage every heartbeat is old, and the first process back must give the others
the threshold to write a fresh one before it judges them. `LostRunSweeper.tick()` tracks that
("database reachable since ...") and sweeps only when it holds; it also says once when the
database went away and once when it came back, instead of a traceback per try.

Both the workers (in their heartbeat thread) and the web server (a small thread started by the
ASGI app) run one, so a dead worker's runs are marked `lost` even when no other worker is alive.
The sweep also re-sends runs still `queued` whose broker message is gone (`services.requeue_lost_messages`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from django.conf import settings

logger = logging.getLogger(__name__)


class OutageLog:
    """One log line when something becomes unavailable and one when it is back."""

    def __init__(self, what: str, log: logging.Logger = logger) -> None:
        self.what = what
        self.log = log
        self.down_since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.log.warning("%s unavailable (%s: %s); retrying quietly until it is back", self.what, type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")

    def ok(self) -> bool:
        """True when this call ends an outage."""
        if self.down_since is None:
            return False
        self.log.warning("%s is back after %.1fs", self.what, time.monotonic() - self.down_since)
        self.down_since = None
        return True


class LostRunSweeper:
    """Call `tick()` every few seconds; it sweeps once the database has been reachable from
    this process for `lost_after_s` without a break."""

    def __init__(self, name: str, lost_after_s: float | None = None, before_sweep: Callable[[], None] | None = None) -> None:
        self.name = name
        self.lost_after_s = settings.INFLIGHT_WORKER_LOST_AFTER_S if lost_after_s is None else lost_after_s
        self.before_sweep = before_sweep
        self.reachable_since: float | None = None
        self.outage = OutageLog(f"database ({name})")

    def may_judge(self) -> bool:
        return self.reachable_since is not None and time.monotonic() - self.reachable_since >= self.lost_after_s

    def tick(self) -> list[int]:
        from django.db import close_old_connections, connection

        from inflight.runs import services

        close_old_connections()
        started = time.monotonic()
        try:
            if self.before_sweep is not None:
                self.before_sweep()  # e.g. the worker's heartbeat: a database round trip of its own
            else:
                connection.ensure_connection()
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            back = self.outage.ok()
            # A round trip that took longer than a heartbeat interval waited for the database (a pooled
            # connection is waited for, not refused, during a short outage): the others' heartbeats
            # may have waited too, so the time they get to write a fresh one starts now.
            slow = time.monotonic() - started > settings.INFLIGHT_HEARTBEAT_INTERVAL_S
            if self.reachable_since is None or back or slow:
                self.reachable_since = time.monotonic()
            if not self.may_judge():
                return []
            lost = services.mark_lost_runs(self.lost_after_s)
            if lost:
                logger.warning("runs %s: their worker processes stopped sending heartbeats (lost, or cancelled if a cancel was pending)", lost)
            services.requeue_lost_messages()
            return lost
        except Exception as exc:  # noqa: BLE001 - the database (or broker) is away: try again next tick
            from django.db import DatabaseError, InterfaceError

            if isinstance(exc, (DatabaseError, InterfaceError)):
                self.reachable_since = None
                self.outage.failed(exc)
            else:
                logger.warning("lost-run sweep failed: %s: %s", type(exc).__name__, exc)
            try:
                connection.close()
            except Exception:  # noqa: BLE001
                pass
            return []
        finally:
            close_old_connections()


def start_sweeper_thread(name: str, interval_s: float | None = None) -> threading.Thread:
    """A daemon thread that ticks a LostRunSweeper every `interval_s` (the heartbeat interval)."""
    interval_s = settings.INFLIGHT_HEARTBEAT_INTERVAL_S if interval_s is None else interval_s
    sweeper = LostRunSweeper(name)

    def loop() -> None:
        while True:
            sweeper.tick()
            time.sleep(interval_s)

    thread = threading.Thread(target=loop, name=f"inflight-sweeper-{name}", daemon=True)
    thread.start()
    return thread
