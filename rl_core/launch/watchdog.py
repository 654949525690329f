"""Whether every role of a run still answers: the launcher's watchdog and the roles' heartbeats.

A stopped (SIGSTOP) or wedged process stays alive with its port open and answers nothing: every
wait on it (the actor's requests to a server, the trainer's wait for samples or for a weight
update, the actor's wait for the trainer's progress) then lasts forever, at 0 tokens/s, with no
child exiting for the launcher to notice. The watchdog gives all those waits one deadline that
is about the role, not about a request:

- an inference server answers when its `GET /health` answers within `HEALTH_DEADLINE_S`
  (polled by one thread per server, so a silent one delays no other check);
- a trainer rank or the actor answers when its heartbeat file `heartbeats/<role>` changes: a
  thread of the role (`rundir/heartbeats.py`'s `start_heartbeat`, one line in its `main`) rewrites it every
  `HEARTBEAT_EVERY_S`; a stopped process writes nothing. The launcher stamps a change with its
  own clock, so the roles' clocks (other nodes of a cluster run) never matter.

A role that has not answered for `SILENT_REPORT_S` is reported in the launcher's metric lines
(`watchdog/silent_s/<role>`, beside `watchdog/silent_s`, the longest silence of any role), which the
platform's `stalled` rule reads; once it has not answered for `monitoring.hang_limit_s` the run
fails naming it (`ended_reason: hung`). Progress-based, not request-based: a large model's long
step or a long generation keeps every role answering and never trips it.

Imports neither torch nor Django; the launcher supervises local and Ray roles alike through it.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rl_core.rundir.heartbeats import HEARTBEAT_EVERY_S
from rl_core.rundir.layout import HEARTBEATS_DIR, heartbeat_path

HEALTH_EVERY_S = 2.0  # the watchdog asks each server's /health this often
HEALTH_DEADLINE_S = 5.0  # an answer later than this is no answer
# Silences shorter than this are the normal gaps between beats and health answers: not reported.
SILENT_REPORT_S = 3 * max(HEARTBEAT_EVERY_S, HEALTH_EVERY_S) + HEALTH_DEADLINE_S
SILENT_METRIC = "watchdog/silent_s"  # the longest silence of any role; `<SILENT_METRIC>/<role>` each silent one


class RoleHung(RuntimeError):
    """A role answered nothing for the hang limit; the message names it."""

    def __init__(self, role: str, message: str) -> None:
        super().__init__(message)
        self.role = role


# --- the launcher's side --------------------------------------------------------------


@dataclass
class _Role:
    name: str
    what: str  # what it did not do, for the error: "answer GET /health", "write its heartbeat"
    last_answer: float
    last_beat: bytes | None = None


@dataclass
class Watchdog:
    """The launcher's view of which roles answer. `watch_server` / `watch_heartbeat` once every
    role started; `check(now, running)` each supervision round raises `RoleHung` for a role
    silent for `hang_limit_s`; `metrics(now)` is what the launcher's metric line carries."""

    run_dir: Path
    hang_limit_s: float
    roles: dict[str, _Role] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def watch_heartbeat(self, role: str) -> None:
        self.roles[role] = _Role(role, f"wrote no heartbeat ({HEARTBEATS_DIR}/{role})", time.monotonic())

    def watch_server(self, role: str, url: str) -> None:
        self.roles[role] = _Role(role, f"did not answer GET {url}/health within {HEALTH_DEADLINE_S:g} s", time.monotonic())
        threading.Thread(target=self._poll_health, args=(role, url), name=f"watchdog-{role}", daemon=True).start()

    def _poll_health(self, role: str, url: str) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=HEALTH_DEADLINE_S) as response:
                    answered = response.status == 200
            except (OSError, urllib.error.URLError, ValueError):
                answered = False
            if answered:
                with self._lock:
                    self.roles[role].last_answer = time.monotonic()
            self._stop.wait(HEALTH_EVERY_S)

    def _read_heartbeats(self, now: float) -> None:
        for role in self.roles.values():
            if role.what.startswith("wrote no heartbeat"):
                try:
                    content = heartbeat_path(self.run_dir, role.name).read_bytes()
                except OSError:
                    continue
                if content != role.last_beat:
                    role.last_beat, role.last_answer = content, now

    def silences(self, now: float, running: set[str] | None = None) -> dict[str, float]:
        """Seconds since each watched role last answered (only the `running` ones, if given)."""
        with self._lock:
            self._read_heartbeats(now)
            return {name: max(0.0, now - role.last_answer) for name, role in self.roles.items()
                    if running is None or name in running}

    def check(self, now: float, running: set[str] | None = None) -> None:
        """Raise `RoleHung` for the role silent longest, once that is `hang_limit_s` or more.
        `running`: the roles whose process has not exited (an exited role is the launcher's
        business: a finished trainer beats no more, a dead one has an exit code)."""
        silences = self.silences(now, running)
        if not silences:
            return
        role, silent = max(silences.items(), key=lambda item: item[1])
        if silent >= self.hang_limit_s:
            raise RoleHung(role, f"{role} stopped answering: it {self.roles[role].what} for {silent:.0f} s "
                                 f"(monitoring.hang_limit_s {self.hang_limit_s:g} s); it may be stopped, wedged or out of memory")

    def metrics(self, now: float, running: set[str] | None = None) -> dict[str, float]:
        """`watchdog/silent_s` (the longest silence) and `watchdog/silent_s/<role>` for each role
        silent `SILENT_REPORT_S` or more: the platform's `stalled` rule fires on them."""
        silences = self.silences(now, running)
        out = {SILENT_METRIC: round(max(silences.values(), default=0.0), 1)}
        for role, silent in silences.items():
            if silent >= SILENT_REPORT_S:
                out[f"{SILENT_METRIC}/{role}"] = round(silent, 1)
        return out

    def close(self) -> None:
        self._stop.set()
