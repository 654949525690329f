"""Wake a run's supervisor as soon as the run writes a line the open pages wait for.

A supervisor that only slept `poll_s` between deliveries added up to `poll_s` (250 ms) to every
live push: at 200 live runs that alone put the push p95 near 250 ms (bench/platform_scale.py).
With inotify the kernel says when metrics.jsonl, evals.jsonl, status.json or resumes.jsonl
changed, and the supervisor delivers at once; the `poll_s` timer stays for everything else (the
rollout stream, alert checks, the cancel flag). Waking costs nothing while a run is quiet, unlike
a shorter poll (200 runs x 20 polls a second of file reads).

One watch may cover several run directories (a thread that drives many runs: the bench's ingest
processes); `wait()` says which of them have news. Where inotify is missing (not Linux) `wait()`
sleeps the timeout and reports nothing, which is the plain polling it replaces.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rl_core.run_dir import EVALS_FILE, METRICS_FILE, RESUMES_FILE, STATUS_FILE

logger = logging.getLogger(__name__)

try:
    from inotify_simple import INotify, flags
except ImportError:  # not Linux: plain polling
    INotify = None  # type: ignore[assignment,misc]

# The files whose new lines reach the pages as pushes (metrics, evaluations, the status line) or
# decide what may be delivered (a resume's rewind). Appends are MODIFY; status.json is replaced
# by a rename (MOVED_TO); a first line may come with the file's creation (CREATE).
WATCHED_FILES = frozenset({METRICS_FILE, EVALS_FILE, STATUS_FILE, RESUMES_FILE})


class RunDirWatch:
    """inotify on run directories, filtered to `WATCHED_FILES`; `close()` releases the descriptor."""

    def __init__(self) -> None:
        self._inotify = None
        self._dirs: dict[int, Path] = {}
        if INotify is not None:
            try:
                self._inotify = INotify()
            except OSError as exc:  # e.g. the per-user instance limit: poll instead, say so once
                logger.warning("inotify unavailable (%s): run directories are polled", exc)

    @property
    def active(self) -> bool:
        return self._inotify is not None

    def add(self, run_dir: Path) -> None:
        """Watch `run_dir` (it must exist: the supervisor writes the run's config there first)."""
        if self._inotify is None:
            return
        try:
            wd = self._inotify.add_watch(str(run_dir), flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.CLOSE_WRITE)
        except OSError as exc:  # e.g. max_user_watches reached: this run is polled
            logger.warning("cannot watch %s (%s): it is polled every poll_s", run_dir, exc)
            return
        self._dirs[wd] = Path(run_dir)

    def wait(self, timeout_s: float) -> set[Path]:
        """Block until a watched file of a watched directory changed, or `timeout_s` passed; the
        directories with news (empty on timeout). Events that came meanwhile are read together."""
        if self._inotify is None:
            time.sleep(max(0.0, timeout_s))
            return set()
        deadline = time.monotonic() + max(0.0, timeout_s)
        changed: set[Path] = set()
        while not changed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for event in self._inotify.read(timeout=max(1, int(left * 1000))):
                if event.name in WATCHED_FILES and event.wd in self._dirs:
                    changed.add(self._dirs[event.wd])
        return changed

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
            self._dirs.clear()

    def __enter__(self) -> RunDirWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
