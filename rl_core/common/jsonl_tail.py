"""Reading a JSONL file while another process appends to it: complete lines only.

A writer appends whole lines (one O_APPEND write each), but a reader can still catch the
last one half-written. `JsonlTail` hands out only lines that end in a newline and keeps
its place (byte offset and line number) between reads; `peek` then `commit` lets a caller
move past lines only once it has delivered them (the platform's supervisor: what the
database did not take is read again on the next poll). Used by the worker's supervisor
(metrics, evals, rollouts), the launcher's console echo of metrics.jsonl and the trainer's
file stream (`stream.FileStreamReader`, which refuses a bad line instead of skipping it).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable

import orjson

logger = logging.getLogger(__name__)

READ_MAX_BYTES = 16 * 1024 * 1024  # one peek reads at most this much of a file (its max_lines bound the rest)


def loads(raw: bytes | str) -> Any:
    """A JSON text as json.loads reads it (ValueError if it is not JSON), read by orjson first:
    reading the lines with the json module was a fifth of a platform ingest process's time at 200
    live runs (bench/platform_scale.py, py-spy --gil). Text orjson refuses is read again by the json
    module, which also takes the NaN and Infinity that Python's json.dumps writes for a
    non-finite value."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def parse_record(raw: bytes | str) -> dict[str, Any] | None:
    """One stream or file line as a JSON object, or None if it is not one (the caller counts it)."""
    try:
        record = loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


@dataclass
class JsonlTail:
    """Complete lines appended to a JSONL file since the last delivered one."""

    path: Path
    offset: int = 0  # byte offset just past the last delivered line
    line_no: int = 0  # 0-based number of the next line at `offset`
    bad_lines: int = 0  # lines skipped because they are not a JSON object, each counted once
    # Raise ValueError on such a line instead of skipping it: a reader that must not lose one.
    strict: bool = False
    # The next line number not yet checked for being bad: a line peeked again (not committed)
    # is neither counted nor logged again.
    _checked_to: int = field(default=0, repr=False)
    _handle: BinaryIO | None = field(default=None, repr=False, compare=False)

    def peek(self, max_lines: int = 5000, wanted: Callable[[int], bool] | None = None) -> tuple[list[tuple[int, dict[str, Any]]], int, int]:
        """(records, new_offset, new_line_no) of complete lines after `offset`; commit() advances.
        `wanted(line_no)` False: the line is passed over unread (not parsed, not returned, never
        counted bad): the rollout viewer keeps one trainer step in N, and parsing the other lines
        was a tenth of an ingest process's time at 200 live runs (bench/platform_scale.py, py-spy)."""
        chunk = self._read_new()
        if not chunk:
            return [], self.offset, self.line_no
        records: list[tuple[int, dict[str, Any]]] = []
        offset, line_no = self.offset, self.line_no
        start = 0
        while len(records) < max_lines:
            end = chunk.find(b"\n", start)
            if end < 0:
                break  # a torn last line: wait until the writer finishes it
            if wanted is not None and not wanted(line_no):
                record = None
            else:
                record = parse_record(chunk[start:end])
                if record is None and self.strict:
                    raise ValueError(f"{self.path} line {line_no} (byte {self.offset + start}): not a JSON object")
                if record is None and line_no >= self._checked_to:
                    self.bad_lines += 1
                    logger.warning("%s line %d is not a JSON object; skipped", self.path.name, line_no)
            if record is not None:
                records.append((line_no, record))
            line_no += 1
            start = end + 1
            offset = self.offset + start
        self._checked_to = max(self._checked_to, line_no)
        return records, offset, line_no

    def _read_new(self) -> bytes:
        """The bytes after `offset` (at most READ_MAX_BYTES); b"" when the file does not exist yet or
        has not grown. The file stays open between reads and one fstat says whether it grew: opening,
        seeking and reading each of a run's five tailed files on every poll was a fifth of a worker
        process's CPU at 200 live runs (bench/platform_scale.py, py-spy), most polls finding nothing
        new in most files. A tailed file is only ever appended to (never replaced), so the handle
        opened once reads every later line."""
        if self._handle is None:
            try:
                self._handle = open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                return b""
        descriptor = self._handle.fileno()
        size = os.fstat(descriptor).st_size
        if size <= self.offset:
            return b""
        return os.pread(descriptor, min(size - self.offset, READ_MAX_BYTES), self.offset)

    def close(self) -> None:
        """Let the file go (a tail reading on opens it again)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def commit(self, offset: int, line_no: int) -> None:
        self.offset, self.line_no = offset, line_no

    def read(self, max_lines: int = 5000) -> list[tuple[int, dict[str, Any]]]:
        """peek() and commit() at once: for a reader that cannot fail to take the lines."""
        records, offset, line_no = self.peek(max_lines)
        self.commit(offset, line_no)
        return records
