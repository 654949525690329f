"""The pipeline's timeline: what each process was doing over wall time, as compact spans.

`metrics.jsonl` says *how much* per step (the longest pause, the step's seconds); it cannot say
*when* a server paused against when the trainer broadcast, or which groups were generating while
a step waited. Each role appends its own spans to `timeline/<lane>.jsonl` (the lane is the
launcher's child name: `server<i>`, `trainer`, `trainer<r>`, `actor`): one file per process, so
the lines of processes on different nodes of a cluster run never share a file (O_APPEND is not
atomic across NFS clients) and each file's bound is its own.

A line is a `TimelineSpan`: `{"role", "lane", "kind", "start", "end"[, "version", "reason",
"count", "running"]}` with unix seconds. Kinds by role:

- server: `decode` (back-to-back decode steps coalesced into one span of at most
  `DECODE_SPAN_MAX_S`: `count` steps, `running` the most sequences in flight), `pause` (a weight
  update's pause, `version` the version it installed);
- trainer rank: `wait` (for samples), `forward_backward`, `optimizer`, `broadcast` (`version`
  sent; rank 0 only sends, the others take part in ZeRO's gathers), `checkpoint`; `drop` with
  `reason: stale` and `count` samples (the trainer's stale drop);
- actor: `group` (launch to finish; `reason` set when nothing of it was written:
  `zero_advantage`, `deferred` by tail batching, `empty`).

Bounded: a lane stops at `MAX_LINES_PER_LANE` lines with one final `truncated` span, so a long
run's file stays a few MB; decode steps never cost a line each. Written by the roles (a few hook
lines each), read by the platform's run page (`web/timeline_views.py`) through `read_lane`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rl_core.rundir.layout import TIMELINE_DIR, timeline_path

MAX_LINES_PER_LANE = 50_000  # ~5 MB a lane; a decode span is ≥ ~1 s of work, so hours of a busy server fit
DECODE_SPAN_MAX_S = 1.0  # a decode span is closed after this long, so a live page sees a busy server within ~1 s
DECODE_GAP_S = 0.05  # steps further apart than this (idle, a pause) start a new span

Role = Literal["server", "trainer", "actor"]


class TimelineSpan(BaseModel):
    """One line of `timeline/<lane>.jsonl`."""

    role: Role = Field(description="Which kind of process wrote it.")
    lane: str = Field(description="The process: the launcher's child name (server0, trainer, trainer1, actor).")
    kind: str = Field(description="What it was doing (module docstring lists the kinds of each role).")
    start: float = Field(description="Unix seconds, the span's start.")
    end: float = Field(description="Unix seconds, the span's end (equal to start for an instant).")
    version: int | None = Field(None, description="A weight update's version (server pause, trainer broadcast).")
    reason: str | None = Field(None, description="Why a group or sample was not trained: zero_advantage, deferred, empty, stale.")
    count: int | None = Field(None, description="Decode steps in a decode span; samples of a stale drop; a group's samples written.")
    running: int | None = Field(None, description="Decode span: the most sequences in flight during it.")


def lane_files(run_dir: str | Path) -> list[Path]:
    """Every lane's file of a run, sorted by name (no file before the roles write)."""
    folder = Path(run_dir) / TIMELINE_DIR
    try:
        return sorted(path for path in folder.iterdir() if path.suffix == ".jsonl" and path.is_file() and not path.is_symlink())
    except OSError:
        return []


def read_lane(path: Path, offset: int = 0, max_bytes: int = 8 * 1024 * 1024) -> tuple[list[dict[str, Any]], int]:
    """Complete lines of one lane's file from byte `offset` (at most `max_bytes`): the spans and the
    offset to continue from. A line still being written (no newline yet) is left for the next read;
    a line that does not parse is skipped (a torn write of a killed process)."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read(max_bytes)
    except OSError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    spans = []
    for line in data[: end + 1].splitlines():
        try:
            spans.append(json.loads(line))
        except ValueError:
            continue
    return spans, offset + end + 1


class TimelineWriter:
    """Appends one lane's spans (thread-safe: a server's decode loop and its HTTP thread both write).
    A write that fails (full disk) is dropped: the timeline is a diagnostic, never a run's failure."""

    def __init__(self, run_dir: str | Path, role: Role, lane: str, max_lines: int = MAX_LINES_PER_LANE) -> None:
        self.role = role
        self.lane = lane
        self.path = timeline_path(run_dir, lane)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_lines = max_lines
        self._lock = threading.Lock()
        # A restarted process (resume) continues its lane's file and its count.
        try:
            with self.path.open("rb") as handle:
                self.lines = sum(1 for _ in handle)
        except OSError:
            self.lines = 0

    def span(self, kind: str, start: float, end: float, **extra: Any) -> None:
        with self._lock:
            if self.lines >= self.max_lines:
                return
            if self.lines == self.max_lines - 1:  # the last line says the lane stops here
                kind, extra = "truncated", {}
            record = {"role": self.role, "lane": self.lane, "kind": kind, "start": round(start, 4), "end": round(end, 4)}
            record.update((key, value) for key, value in extra.items() if value is not None)
            try:
                # One O_APPEND write per line: a reader never sees half a line followed by another's.
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
                finally:
                    os.close(fd)
            except OSError:
                return
            self.lines += 1


class ServerTimeline:
    """A server's lane: its decode steps coalesced into spans, and every weight update's pause.
    The engine's loop calls `step` after each step and `idle` before it sleeps; the pause is
    recorded by the engine's `paused()` once it ends (no step runs during it)."""

    def __init__(self, writer: TimelineWriter) -> None:
        self.writer = writer
        self._lock = threading.Lock()
        self._open: list[float] | None = None  # [start, end, steps, most running]

    def step(self, start: float, end: float, running: int) -> None:
        with self._lock:
            span = self._open
            if span is not None and start - span[1] <= DECODE_GAP_S and end - span[0] <= DECODE_SPAN_MAX_S:
                span[1], span[2], span[3] = end, span[2] + 1, max(span[3], running)
                return
            self._flush_locked()
            self._open = [start, end, 1, running]

    def idle(self) -> None:
        with self._lock:
            self._flush_locked()

    def pause(self, start: float, end: float, version: int) -> None:
        with self._lock:
            self._flush_locked()  # the steps before the pause end before it starts
            self.writer.span("pause", start, end, version=version)

    def _flush_locked(self) -> None:
        if self._open is not None:
            start, end, steps, running = self._open
            self.writer.span("decode", start, end, count=int(steps), running=int(running))
            self._open = None


class TrainerTimeline:
    """A trainer rank's lane: one call per phase, each span ending where the next starts."""

    def __init__(self, writer: TimelineWriter) -> None:
        self.writer = writer
        self.mark = time.time()  # where the next phase starts

    def phase(self, kind: str, end: float | None = None, **extra: Any) -> None:
        """The phase that ran from the previous mark until `end` (now by default)."""
        end = time.time() if end is None else end
        self.writer.span(kind, self.mark, end, **extra)
        self.mark = end

    def dropped_stale(self, count: int) -> None:
        if count:
            now = time.time()
            self.writer.span("drop", now, now, reason="stale", count=count)


class ActorTimeline:
    """The actor's lane: every group from launch to finish, and why nothing of it was written."""

    def __init__(self, writer: TimelineWriter, deferrable: bool) -> None:
        self.writer = writer
        self.deferrable = deferrable  # async tail batching: an empty group was deferred
        self.launched: dict[int, float] = {}
        self.zero_advantage: set[str] = set()

    def launch(self, index: int) -> None:
        self.launched[index] = time.time()

    def dropped_zero_advantage(self, group_id: str) -> None:
        self.zero_advantage.add(group_id)

    def done(self, index: int | None, samples: int) -> None:
        if index is None or index not in self.launched:
            return  # a sync tail round: its groups have no launch of their own
        group_id = f"g{index:08d}"  # as the plans name a group
        reason = None
        if group_id in self.zero_advantage:
            self.zero_advantage.discard(group_id)
            reason = "zero_advantage"
        elif not samples:
            reason = "deferred" if self.deferrable else "empty"
        self.writer.span("group", self.launched.pop(index), time.time(), reason=reason, count=samples)
