"""What a dataset file must be: UTF-8 JSON lines, each an object with the problem text
(`problem`, or GSM8K's `question`) and its `answer`, ids unique, at most MAX_DATASET_BYTES.
The row rules are the engine's own (`rl_core.envs.problems`), so a file that passes here loads in a run.
Every bad row is named by its line number (the first MAX_REPORTED_ERRORS of them)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import IO, Iterable

from rl_core.envs.problems import TaskDataError, _row_to_problem

# The one size limit of a dataset file (upload and registration alike); the web server's body
# limit for the upload paths follows it (web/middleware.py).
MAX_DATASET_BYTES = 64 * 1024 * 1024
MAX_REPORTED_ERRORS = 20
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")
NAME_RULE = "1-80 characters: letters, digits, '_', '-' and '.', starting with a letter or digit"


@dataclass
class CheckedFile:
    """The outcome of checking a file: its rows, size and digest, and every problem found."""

    rows: int = 0
    size_bytes: int = 0
    sha256: str = ""
    errors: list[str] = field(default_factory=list)
    more_errors: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, message: str) -> None:
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(message)
        else:
            self.more_errors += 1

    def summary(self) -> str:
        extra = f" (and {self.more_errors} more)" if self.more_errors else ""
        return "; ".join(self.errors) + extra


def name_error(name: str) -> str | None:
    return None if NAME_RE.fullmatch(name or "") else f"name must be {NAME_RULE}"


def check_lines(lines: Iterable[bytes]) -> CheckedFile:
    """Check raw lines (bytes, newline included) one by one; stops counting size past the limit."""
    result = CheckedFile()
    digest = hashlib.sha256()
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        result.size_bytes += len(raw)
        if result.size_bytes > MAX_DATASET_BYTES:
            result.add(f"the file is over {MAX_DATASET_BYTES // (1024 * 1024)} MiB (the limit of a dataset)")
            break
        digest.update(raw)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            result.add(f"line {number}: not UTF-8 text")
            continue
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            result.add(f"line {number}: not valid JSON ({exc.msg})")
            continue
        if not isinstance(row, dict):
            result.add(f"line {number}: expected a JSON object with 'problem' and 'answer'")
            continue
        try:
            problem = _row_to_problem(row, f"line {number}", default_id=f"line-{number}")
        except TaskDataError as exc:
            result.add(str(exc))
            continue
        if problem.id in seen:
            result.add(f"line {number}: duplicate id {problem.id!r} (first on line {seen[problem.id]})")
            continue
        seen[problem.id] = number
        result.rows += 1
    result.sha256 = digest.hexdigest()
    if not result.errors and result.rows == 0:
        result.add("the file has no rows: one JSON object per line, e.g. {\"problem\": \"1+1?\", \"answer\": \"2\"}")
    return result


def check_stream(handle: IO[bytes]) -> CheckedFile:
    # readline bounded: one line longer than the limit is still read only up to it.
    return check_lines(iter(lambda: handle.readline(MAX_DATASET_BYTES + 1), b""))


# Paths whose body is a dataset file (the page's upload form, the API's upload): their body
# limit is the dataset's, plus room for the form's other fields.
UPLOAD_PATHS = ("/datasets/", "/api/datasets/upload/")
UPLOAD_FORM_OVERHEAD_BYTES = 64 * 1024


def upload_body_limit(path: str, default: int | None) -> int | None:
    """The request body limit of `path` (web.middleware.InputGuardMiddleware)."""
    return MAX_DATASET_BYTES + UPLOAD_FORM_OVERHEAD_BYTES if path in UPLOAD_PATHS else default
