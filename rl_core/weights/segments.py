"""Names and clean-up of the shared-memory segments of a same-device weight handoff.

A CPU run whose trainer and servers share the node hands weights over through one file under
/dev/shm (`weights/handoff.py`). Its name says whose it is: `inflight-weights-<run tag>-<pid>-<n>`,
the run tag a digest of the run directory's resolved path, the pid the trainer's, n its count of
segments (a new parameter list gets a new segment, never an old name a server has mapped). The
trainer unlinks it as soon as every server has answered its first update (a mapping outlives the
name), so a SIGKILL of either side leaves at most the segment of an update in progress; the
launcher, which outlives both, removes whatever is left of its run when the run ends
(`remove_run_segments`), and a trainer removes the segments of its run whose owner is dead before
it creates its own.

Standard library only: the launcher imports it without torch.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
from pathlib import Path

SEGMENT_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "inflight-weights-"
# What a server accepts as a segment name: no path separators, so a request cannot point a
# server at any file but a handoff segment under SEGMENT_DIR.
SEGMENT_NAME_PATTERN = re.compile(r"^inflight-weights-[A-Za-z0-9_.-]+-[0-9]+-[0-9]+$")
_SEGMENT_NUMBERS = itertools.count(1)


def run_segment_tag(run_dir: str | Path) -> str:
    """A short, stable tag of a run (its resolved directory): every segment of the run carries it."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


def segment_name(tag: str, pid: int | None = None, number: int | None = None) -> str:
    """Segment `number` (default: this process's next) of process `pid` (default: this one) for run tag `tag`."""
    return f"{SEGMENT_PREFIX}{tag}-{os.getpid() if pid is None else pid}-{next(_SEGMENT_NUMBERS) if number is None else number}"


def check_segment_name(name: str) -> Path:
    """The path of a segment named by a peer, or ValueError when the name is not a segment's."""
    if not SEGMENT_NAME_PATTERN.match(name):
        raise ValueError(f"segment name {name!r} is not a weight-handoff segment ({SEGMENT_PREFIX}<tag>-<pid>-<n>)")
    return SEGMENT_DIR / name


def run_segments(tag: str) -> list[Path]:
    """Every segment of run `tag` that exists now."""
    if not SEGMENT_DIR.is_dir():
        return []
    return sorted(SEGMENT_DIR.glob(f"{SEGMENT_PREFIX}{tag}-*"))


def _owner_alive(path: Path) -> bool:
    pid = int(path.name.rsplit("-", 2)[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_run_segments(run_dir: str | Path, only_dead_owners: bool = False) -> list[Path]:
    """Unlink the run's segments (those of dead owners only, when asked); returns what went."""
    removed = []
    for path in run_segments(run_segment_tag(run_dir)):
        if only_dead_owners and _owner_alive(path):
            continue
        try:
            path.unlink()
        except FileNotFoundError:  # its owner or a server unlinked it meanwhile
            continue
        removed.append(path)
    return removed
