"""Wake a run's supervisor as soon as the run writes a line the open pages wait for.

A supervisor that only slept `poll_s` between deliveries added up to `poll_s` (250 ms) to every
live push: at 200 live runs that alone put the push p95 near 250 ms (bench/platform_scale.py).
With inotify the kernel says when metrics.jsonl, evals.jsonl, status.json or resumes.jsonl
changed, and the supervisor delivers at once; the `poll_s` timer stays for everything else (the
rollout stream, alert checks, the cancel flag). Waking costs nothing while a run is quiet, unlike
a shorter poll (200 runs x 20 polls a second of file reads).

One inotify descriptor and one reader thread serve the whole process (`_Inotify`): a worker
supervising many runs, each on its own thread, would otherwise hold one descriptor per run, and
the kernel allows a user 128 (fs.inotify.max_user_instances) across all its processes. A
`RunDirWatch` may cover several run directories (a thread that drives many runs: the bench's
ingest processes); `wait()` says which of them have news. Where inotify is missing (not Linux)
or refused, `wait()` sleeps the timeout and reports nothing: the plain polling it replaces.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from rl_core.rundir.layout import EVALS_FILE, METRICS_FILE, RESUMES_FILE, STATUS_FILE

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
    """Which of its run directories wrote a watched file since the last `wait()`; `close()` stops
    watching them."""

    def __init__(self) -> None:
        self._news = threading.Condition()
        self._changed: set[Path] = set()
        self._dirs: dict[Path, int] = {}  # run directory -> its watch descriptor
        self._inotify = _Inotify.shared()

    @property
    def active(self) -> bool:
        return self._inotify is not None

    def add(self, run_dir: Path) -> None:
        """Watch `run_dir` (it must exist: the supervisor writes the run's config there first)."""
        if self._inotify is None:
            return
        run_dir = Path(run_dir)
        wd = self._inotify.watch(run_dir, self)
        if wd is not None:
            self._dirs[run_dir] = wd

    def wait(self, timeout_s: float) -> set[Path]:
        """Block until a watched file of a watched directory changed, or `timeout_s` passed; the
        directories with news (empty on timeout), all that came meanwhile."""
        if self._inotify is None:
            time.sleep(max(0.0, timeout_s))
            return set()
        with self._news:
            self._news.wait_for(lambda: bool(self._changed), max(0.0, timeout_s))
            changed, self._changed = self._changed, set()
        return changed

    def _changed_in(self, run_dir: Path) -> None:
        # On the reader thread.
        with self._news:
            self._changed.add(run_dir)
            self._news.notify_all()

    def close(self) -> None:
        if self._inotify is not None:
            for run_dir, wd in self._dirs.items():
                self._inotify.unwatch(wd, run_dir, self)
        self._dirs.clear()

    def __enter__(self) -> RunDirWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Inotify:
    """The process's inotify descriptor and the daemon thread that reads it and tells each
    watching `RunDirWatch`. Made on first use, and again in a forked child (the thread does not
    survive a fork)."""

    _instance: _Inotify | None = None
    _refused = False
    _lock = threading.Lock()

    @classmethod
    def shared(cls) -> _Inotify | None:
        with cls._lock:
            if INotify is None or cls._refused:
                return None
            if cls._instance is None or cls._instance.pid != os.getpid():
                try:
                    cls._instance = cls()
                except OSError as exc:  # e.g. the per-user instance limit: poll instead, say so once
                    logger.warning("inotify unavailable (%s): run directories are polled", exc)
                    cls._refused = True
                    return None
            return cls._instance

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._inotify = INotify()
        self._lock = threading.Lock()
        # watch descriptor -> (directory, the watches that asked for it); one directory watched
        # twice (two supervisors of one run directory, in tests) shares its descriptor.
        self._watchers: dict[int, tuple[Path, set[RunDirWatch]]] = {}
        threading.Thread(target=self._read_forever, name="inflight-run-dir-watch", daemon=True).start()

    def watch(self, run_dir: Path, watcher: RunDirWatch) -> int | None:
        try:
            wd = self._inotify.add_watch(str(run_dir), flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.CLOSE_WRITE)
        except OSError as exc:  # e.g. max_user_watches reached: this run is polled
            logger.warning("cannot watch %s (%s): it is polled every poll_s", run_dir, exc)
            return None
        with self._lock:
            self._watchers.setdefault(wd, (run_dir, set()))[1].add(watcher)
        return wd

    def unwatch(self, wd: int, run_dir: Path, watcher: RunDirWatch) -> None:
        with self._lock:
            entry = self._watchers.get(wd)
            if entry is None:
                return
            entry[1].discard(watcher)
            if entry[1]:
                return
            del self._watchers[wd]
        try:
            self._inotify.rm_watch(wd)
        except OSError:  # the directory is gone (its watch went with it)
            pass

    def _read_forever(self) -> None:
        while True:
            try:
                events = self._inotify.read()
            except OSError:  # pragma: no cover - the descriptor failed: every watch falls back to its timer
                logger.exception("inotify read failed; run directories are polled from now on")
                return
            with self._lock:
                told = {(entry[0], watcher) for event in events if event.name in WATCHED_FILES
                        and (entry := self._watchers.get(event.wd)) is not None for watcher in entry[1]}
            for run_dir, watcher in told:
                watcher._changed_in(run_dir)
