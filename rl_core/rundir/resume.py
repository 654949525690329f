"""Resuming a run: refuse loudly when the checkpoint cannot be used, record what the resume rewinds.

`python -m rl_core run CONFIG --out DIR --resume` continues the run in DIR from
`checkpoints/latest`: the trainer loads its weights, optimizer and stream position
(`trainer_state.json`), so every sample written to the stream after that position — trained
in steps whose weights died with the crash, or not trained at all — is trained exactly once
by the resumed run, in the same order; the actor continues the prompt order where the stream
ends. Nothing here imports torch: the platform calls `check_checkpoint` before it accepts a
resume.

What a resume rewinds. Steps after the checkpoint's were logged before the crash and are
trained (and logged) again, so the append-only files hold two histories. Before the children
start, `record_resume` appends one line to `DIR/resumes.jsonl`:

    {"t": unix_s, "step": k, "checkpoint": "checkpoints/step_00000k",
     "lines": {"metrics.jsonl": L, "evals.jsonl": E, "trainer_shards.jsonl": S}}

where L, E, S are the complete lines each file had then. A line numbered below L (0-based)
whose `step` is above k is *superseded*: the run's history continues from the resumed lines
instead (`is_superseded`). Nothing is deleted: the files stay append-only and a reader (the
platform's supervisor, a script) drops the superseded lines. A torn last line (a writer
killed mid-line) is closed with a newline first, so the next appended line is not glued to it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_core.rundir.layout import (
    CHECKPOINT_STATE_FILE,
    CHECKPOINTS_DIR,
    EVALS_FILE,
    LATEST_CHECKPOINT_LINK,
    METRICS_FILE,
    RESUMES_FILE,
    SHARDS_FILE,
)

REWOUND_FILES = (METRICS_FILE, EVALS_FILE, SHARDS_FILE)
_STATE_KEYS = ("version", "stream_position", "consumed")


class ResumeError(RuntimeError):
    """The run cannot be resumed; the message names the checkpoint and what is wrong with it."""


@dataclass(frozen=True)
class ResumePoint:
    step: int
    checkpoint: str  # relative to the run directory: checkpoints/step_NNNNNN
    t: float = 0.0
    lines: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "step": self.step, "checkpoint": self.checkpoint, "lines": dict(self.lines)}


def check_checkpoint(run_dir: str | Path) -> ResumePoint:
    """The step and name of `checkpoints/latest`, after checking it can be loaded: the link
    resolves inside `checkpoints/`, the weights and optimizer files are there and its
    `trainer_state.json` parses with a stream position. ResumeError naming it otherwise."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    link = root / LATEST_CHECKPOINT_LINK
    latest = f"{CHECKPOINTS_DIR}/{LATEST_CHECKPOINT_LINK}"
    if not link.is_symlink() and not link.exists():
        raise ResumeError(f"cannot resume: {latest} does not exist (the run wrote no checkpoint)")
    target = os.readlink(link) if link.is_symlink() else link.name
    name = f"{CHECKPOINTS_DIR}/{Path(target).name}"
    checkpoint = link.resolve()
    if not checkpoint.is_dir():
        raise ResumeError(f"cannot resume: checkpoint {name} ({latest}) is missing")
    if checkpoint.parent != root.resolve():
        raise ResumeError(f"cannot resume: checkpoint {name} is not inside {CHECKPOINTS_DIR}/")
    for required in ("model.safetensors", "optimizer.pt", CHECKPOINT_STATE_FILE):
        if not (checkpoint / required).is_file():
            raise ResumeError(f"cannot resume: checkpoint {name} is unreadable: {required} is missing")
    try:
        state = json.loads((checkpoint / CHECKPOINT_STATE_FILE).read_text())
        step = int(state["version"])
        if not all(key in state for key in _STATE_KEYS):
            raise KeyError(", ".join(key for key in _STATE_KEYS if key not in state))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ResumeError(f"cannot resume: checkpoint {name} is unreadable: {CHECKPOINT_STATE_FILE}: {exc!r}") from exc
    return ResumePoint(step=step, checkpoint=name)


def _close_torn_line(path: Path) -> int:
    """Complete lines of `path` after ending a torn last line with a newline."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    if data and not data.endswith(b"\n"):
        with open(path, "ab") as handle:
            handle.write(b"\n")
        return data.count(b"\n") + 1
    return data.count(b"\n")


def record_resume(run_dir: str | Path) -> ResumePoint:
    """Check the checkpoint, then append the resume's line to `resumes.jsonl` (see the module
    docstring). Called by the launcher before any child starts, so no line of the resumed
    attempt is counted."""
    run_dir = Path(run_dir)
    point = check_checkpoint(run_dir)
    lines = {name: _close_torn_line(run_dir / name) for name in REWOUND_FILES}
    point = ResumePoint(step=point.step, checkpoint=point.checkpoint, t=time.time(), lines=lines)
    with open(run_dir / RESUMES_FILE, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(point.to_json()) + "\n")
    return point


def read_resumes(run_dir: str | Path) -> list[ResumePoint]:
    """Every recorded resume of the run, oldest first ([] for a run never resumed)."""
    try:
        text = (Path(run_dir) / RESUMES_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    points = []
    for raw in text.splitlines():
        try:
            data = json.loads(raw)
            points.append(ResumePoint(step=int(data["step"]), checkpoint=str(data["checkpoint"]), t=float(data["t"]),
                                      lines={str(k): int(v) for k, v in data["lines"].items()}))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a torn last line: its resume had not started any child yet
    return points


def is_superseded(resumes: list[ResumePoint], file_name: str, line_no: int, step: int) -> bool:
    """Whether line `line_no` (0-based) of `file_name`, logged at `step`, belongs to a history
    that a later resume rewound (see the module docstring)."""
    return any(line_no < point.lines.get(file_name, 0) and step > point.step for point in resumes)
