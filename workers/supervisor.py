"""Run one `python -m rl_core run` as a subprocess group and tail its run directory.

No Django here: what the files say is handed to a `Reporter` (the Celery task's adapter
onto the platform's services). The files are the buffer: a tail's offset only moves past
lines the reporter accepted, so if the database is briefly away, those lines are read and
delivered again on a later poll — nothing the run logged is lost.

Order of a supervision, as `supervise()` runs it:
1. write the submitted config, start the child in its own session (process group);
2. as soon as the run writes metrics.jsonl, evals.jsonl or status.json (inotify,
   `run_dir_watch.py`; at most every `min_gap_s`) and at least every `poll_s` (250 ms):
   deliver new complete lines of metrics.jsonl, evals.jsonl and the rollout stream, report
   status.json changes and new checkpoints, and ask whether the run was cancelled — if so
   SIGTERM the group, SIGKILL after a timeout;
3. when the child has exited: drain the files, kill any straggler of the group, and decide the
   final status from status.json and the exit code.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from rl_core.common.jsonl_tail import JsonlTail, loads
from rl_core.common.processes import die_with_parent, stop_process_groups
from rl_core.rundir.resume import ResumePoint, is_superseded, read_resumes  # stdlib only: no torch here
from rl_core.rundir.layout import (  # no torch either: the run directory's layout and records
    CHECKPOINTS_DIR,
    DISCARDED_ROLLOUTS_FILE,
    EVALS_FILE,
    FINAL_STATES,
    LOGS_DIR,
    METRICS_FILE,
    STATUS_FILE,
    SUBMITTED_CONFIG_FILE,
    TRAIN_LOGPROBS_FILE,
    read_status,
)
from rl_core.rundir.stream import start_redis_server  # no torch: the stream's files and Redis
from workers.run_dir_watch import RunDirWatch
from workers.stream_tail import FileStreamTail, RedisStreamTail, rollouts_tail as open_rollouts_tail

logger = logging.getLogger(__name__)

SUPERVISOR_LOG = f"{LOGS_DIR}/supervisor_child.log"


class Delivery(Protocol):
    """Lines a reporter took but may still be writing (metrics, rollouts): the supervisor asks
    `ready()` on later polls and moves its tail past the lines only once `settle()` returned
    (it raises when they were not stored: they are read and sent again)."""

    def ready(self) -> bool:
        """Whether the write is over (stored or failed)."""

    def settle(self) -> None:
        """What follows a stored write (alert rules, the stall clock); raises if it failed."""


class Reporter(Protocol):
    """Where supervision results go: the whole interface a supervisor calls (`PlatformReporter`
    in workers/tasks.py stores them; `NullReporter` drops them). Any method may raise (e.g. the
    database is away): the supervisor keeps what it could not deliver and tries again on the
    next poll."""

    def metrics(self, records: list[tuple[int, dict[str, Any]]]) -> Delivery | None:
        """Records of metrics.jsonl with their 0-based line numbers (the idempotency key). None:
        stored already; a `Delivery`: being written (the supervisor's other work goes on)."""

    def evaluation(self, line_no: int, record: dict[str, Any], problem_rows: list[dict[str, Any]]) -> Delivery | None:
        """One evals.jsonl line with its per-problem rows. None: stored; a `Delivery`: being
        written. A malformed line raises ValueError/KeyError/TypeError (here or when settled)."""

    def rollouts(self, records: list[tuple[int, dict[str, Any]]], lines_read: int) -> Delivery | None:
        """Rollout stream lines with their 0-based line numbers (the rollout viewer), and how many
        lines of the stream were read so far (those passed over by `rollout_lines_wanted`
        included: `records` may be empty). None: stored; a `Delivery`: being written."""

    def rollout_lines_wanted(self) -> Callable[[int], bool] | None:
        """Which stream lines `rollouts` needs (by line number); the others are passed over
        unparsed. None: all of them."""

    def train_logprobs(self, records: list[dict[str, Any]]) -> None:
        """train_logprobs.jsonl lines whose stream lines were delivered (importance ratios)."""

    def discarded_rollouts(self, records: list[tuple[int, dict[str, Any]]]) -> Delivery | None:
        """stream/discarded.jsonl lines (samples the actor did not train, with why) and their
        0-based line numbers. None: stored; a `Delivery`: being written."""

    def running(self, pid: int) -> None:
        """The child reported `running` in status.json."""

    def waiting(self, detail: str) -> None:
        """What a `starting` run waits for (a cluster run's placement group); "" once it no longer waits."""

    def resumed(self, point: Any) -> None:
        """A resume the engine recorded (a resumes.jsonl line), before any line written after it."""

    def checkpoints_changed(self) -> None:
        """The run's checkpoints/ folder changed: a checkpoint was saved."""

    def tick(self) -> None:
        """Called on every poll: checks that fire on silence (a stalled run)."""

    def cancel_requested(self) -> bool:
        """Whether the run should be cancelled."""


class NullReporter:
    """A `Reporter` that keeps nothing and never cancels: a supervisor with no platform behind
    it (tests, benches); subclasses override what they record."""

    def metrics(self, records: list[tuple[int, dict[str, Any]]]) -> Delivery | None:
        return None

    def evaluation(self, line_no: int, record: dict[str, Any], problem_rows: list[dict[str, Any]]) -> Delivery | None:
        return None

    def rollouts(self, records: list[tuple[int, dict[str, Any]]], lines_read: int) -> Delivery | None:
        return None

    def rollout_lines_wanted(self) -> Callable[[int], bool] | None:
        return None

    def train_logprobs(self, records: list[dict[str, Any]]) -> None:
        pass

    def discarded_rollouts(self, records: list[tuple[int, dict[str, Any]]]) -> Delivery | None:
        return None

    def running(self, pid: int) -> None:
        pass

    def waiting(self, detail: str) -> None:
        pass

    def resumed(self, point: Any) -> None:
        pass

    def checkpoints_changed(self) -> None:
        pass

    def tick(self) -> None:
        pass

    def cancel_requested(self) -> bool:
        return False


@dataclass
class Outcome:
    status: str  # succeeded | failed | cancelled
    error: str = ""
    exit_code: int | None = None
    ended_reason: str = ""  # status.json's (run_dir.EndedReason); "" when the run wrote none
    ended_detail: str = ""


# Lines of train_logprobs.jsonl held in memory while their stream lines are not delivered.
TRAIN_LOGPROBS_WAITING_MAX = 20_000


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _step_of(record: dict[str, Any]) -> int:
    try:
        return int(record.get("step", 0))
    except (TypeError, ValueError):
        return 0


def read_problem_rows(run_dir: Path, results_file: str | None) -> list[dict[str, Any]]:
    if not results_file:
        return []
    path = (run_dir / results_file).resolve()
    if run_dir.resolve() not in path.parents:
        raise ValueError(f"results_file {results_file!r} points outside the run directory")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rows.append(loads(line))
    return rows


@dataclass
class RunSupervisor:
    run_dir: Path
    config_yaml: str
    command_prefix: list[str]  # e.g. [python, "-m", "rl_core"]; `run CONFIG --out DIR` is appended
    reporter: Reporter
    cwd: Path
    poll_s: float = 0.25
    # Deliveries woken by the run's writes are at least this far apart: a run logging 100 lines a
    # second costs 20 transactions a second, not 100 (the consumer paces pushes to pages anyway).
    min_gap_s: float = 0.05
    cancel_poll_s: float = 1.0
    term_timeout_s: float = 20.0
    drain_timeout_s: float = 120.0  # after exit: how long to keep retrying undelivered lines
    env: dict[str, str] | None = None
    # Continue the run in `run_dir` from its latest checkpoint (`--resume`): the directory is
    # kept, and lines the resume rewinds (rl_core/rundir/resume.py) are not delivered.
    resume: bool = False
    process: subprocess.Popen | None = field(default=None, init=False)
    resumes: list[ResumePoint] = field(default_factory=list, init=False)
    resumes_reported: int = field(default=0, init=False)
    resume_seen: bool = field(default=False, init=False)  # this attempt's resumes.jsonl line was read
    metrics_tail: JsonlTail = field(init=False)
    evals_tail: JsonlTail = field(init=False)
    rollouts_tail: FileStreamTail | RedisStreamTail = field(init=False)  # the stream the config names
    train_logprobs_tail: JsonlTail = field(init=False)
    discarded_tail: JsonlTail = field(init=False)  # the actor's discarded samples (always a file)
    # train_logprobs.jsonl lines read but not yet handed over: a line waits until the stream lines
    # it covers (`consumed`) are delivered, so the rows it attaches to exist.
    train_logprobs_waiting: list[dict[str, Any]] = field(default_factory=list, init=False)
    reported_running: bool = field(default=False, init=False)
    reported_detail: str = field(default="", init=False)  # the last `detail` of a starting run handed over
    cancel_sent_at: float | None = field(default=None, init=False)
    next_cancel_check: float = field(default=0.0, init=False)
    # checkpoints/'s mtime when last looked at; None: absent; unset until the first look (a resumed
    # run's existing checkpoints are not news).
    checkpoints_mtime_ns: int | None = field(default=None, init=False)
    checkpoints_looked: bool = field(default=False, init=False)
    failing_since: dict[str, float] = field(default_factory=dict, init=False)
    # Lines the reporter is still writing, by tail ("metrics", "rollouts"), and where that tail goes
    # once they are stored.
    in_flight: dict[str, tuple[Delivery, Any, int]] = field(default_factory=dict, init=False)

    def _failed(self, what: str, detail: str) -> None:
        """One warning when `what` starts failing (the database is away), not one per poll."""
        if what not in self.failing_since:
            self.failing_since[what] = time.monotonic()
            exc = sys.exc_info()[1]
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}" if exc else ""
            logger.warning("run dir %s: %s failed (%s); %s; retrying quietly", self.run_dir, what, reason, detail)

    def _ok(self, what: str) -> None:
        since = self.failing_since.pop(what, None)
        if since is not None:
            logger.warning("run dir %s: %s works again after %.1fs", self.run_dir, what, time.monotonic() - since)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.metrics_tail = JsonlTail(self.run_dir / METRICS_FILE)
        self.evals_tail = JsonlTail(self.run_dir / EVALS_FILE)
        self.rollouts_tail = open_rollouts_tail(self.run_dir, self.config_yaml)
        self.train_logprobs_tail = JsonlTail(self.run_dir / TRAIN_LOGPROBS_FILE)
        self.discarded_tail = JsonlTail(self.run_dir / DISCARDED_ROLLOUTS_FILE)

    # -------------------------------------------------------------- 1. start

    def start(self) -> int:
        if self.resume:
            self.resumes = read_resumes(self.run_dir)
            self.resumes_reported = len(self.resumes)
            # The dead attempt's status.json must not be read as this attempt's end.
            old = self.run_dir / STATUS_FILE
            if old.exists():
                (self.run_dir / LOGS_DIR).mkdir(exist_ok=True)
                old.rename(self.run_dir / LOGS_DIR / f"status.before-resume-{len(self.resumes) + 1}.json")
        elif self.run_dir.exists() and any(self.run_dir.iterdir()):
            # Left over from another database's run with the same id (e.g. the demo's database was
            # reset): the engine refuses to mix two runs in one directory, so keep it aside.
            stale = self.run_dir.with_name(f"{self.run_dir.name}.stale-{int(time.time())}")
            self.run_dir.rename(stale)
            logger.warning("run dir %s was not empty; moved to %s", self.run_dir, stale)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / LOGS_DIR).mkdir(exist_ok=True)
        config_path = self.run_dir / SUBMITTED_CONFIG_FILE
        config_path.write_text(self.config_yaml)
        command = [*self.command_prefix, "run", str(config_path), "--out", str(self.run_dir), *(["--resume"] if self.resume else [])]
        log = open(self.run_dir / SUPERVISOR_LOG, "ab")
        try:
            self.process = subprocess.Popen(
                # SIGTERM to the run if this worker dies (no orphaned runs), set without a
                # preexec_fn: the worker is threaded (rl_core/common/processes.py says why).
                die_with_parent(command),
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: one signal reaches all its children
            )
        finally:
            log.close()
        logger.info("run dir %s: started pid %d: %s", self.run_dir, self.process.pid, " ".join(command))
        return self.process.pid

    # -------------------------------------------------------------- 2. watch

    def _attempt(self, what: str, retry: str | Callable[[], str], action: Callable[[], object]) -> bool:
        """One step of delivery; False when the reporter raised (the database is away): what was
        not delivered stays in its file and is tried again on the next poll."""
        try:
            action()
        except Exception:  # noqa: BLE001 - said once by _failed; retried on the next poll
            self._failed(what, retry() if callable(retry) else retry)
            return False
        self._ok(what)
        return True

    def deliver(self) -> bool:
        """Hand new lines to the reporter; True when everything written so far is delivered."""
        if not self.resume_recorded():
            return False
        metrics = self._attempt("metrics delivery", lambda: f"will retry from line {self.metrics_tail.line_no}",
                                self._deliver_metrics)
        evals = self._attempt("eval delivery", lambda: f"will retry from line {self.evals_tail.line_no}",
                              self._deliver_evaluations)
        # Its own tail: rollouts that cannot be stored never hold up the metrics.
        rollouts = self._attempt("rollout delivery", lambda: f"will retry from line {self.rollouts_tail.line_no}",
                                 self._deliver_rollouts)
        train_logprobs = self.deliver_train_logprobs()
        discarded = self._attempt("discarded rollout delivery", lambda: f"will retry from line {self.discarded_tail.line_no}",
                                  self._deliver_discarded)
        return metrics and evals and rollouts and train_logprobs and discarded and not self.in_flight

    def _settled(self, kind: str, tail: Any, malformed: tuple[type[Exception], ...] = ()) -> bool:
        """Whether `kind`'s tail is free to read on: no write of its lines under way. A finished
        write is settled here (raising if it failed: the same lines are read and sent again on the
        next poll) and the tail moved past its lines. An error of a `malformed` type is the lines'
        own (retrying cannot fix it): said, and the lines are passed."""
        entry = self.in_flight.get(kind)
        if entry is None:
            return True
        delivery, offset, line_no = entry
        if not delivery.ready():
            return False
        del self.in_flight[kind]
        try:
            delivery.settle()
        except malformed as exc:
            logger.error("%s line %d skipped: %s", tail.path.name, line_no - 1, exc)
        tail.commit(offset, line_no)
        return True

    def _handed_over(self, kind: str, tail: Any, delivery: Delivery | None, offset: Any, line_no: int) -> None:
        """Move `tail` past lines the reporter took: now if it stored them (None, or a ready
        delivery), else once its write is settled on a later poll (the other deliveries go on)."""
        if delivery is not None and not delivery.ready():
            self.in_flight[kind] = (delivery, offset, line_no)
            return
        if delivery is not None:
            delivery.settle()
        tail.commit(offset, line_no)

    def _deliver_metrics(self) -> None:
        if not self._settled("metrics", self.metrics_tail):
            return
        records, offset, line_no = self.metrics_tail.peek()
        records = [(n, r) for n, r in records if not is_superseded(self.resumes, METRICS_FILE, n, _step_of(r))]
        self._handed_over("metrics", self.metrics_tail, self.reporter.metrics(records) if records else None, offset, line_no)

    def _deliver_evaluations(self) -> None:
        # One evaluation at a time (a failure re-sends only the ones not yet stored), handed over as
        # rollouts are: its write settles on a later poll. Malformed for good (retrying cannot fix
        # it): skipped, its line said.
        malformed = (ValueError, KeyError, TypeError, OSError)
        while self._settled("evals", self.evals_tail, malformed):
            records, offset, line_no = self.evals_tail.peek(max_lines=1)
            if line_no == self.evals_tail.line_no:
                return  # nothing new
            records = [(n, r) for n, r in records if not is_superseded(self.resumes, EVALS_FILE, n, _step_of(r))]
            delivery = None
            for eval_line_no, record in records:
                try:
                    rows = read_problem_rows(self.run_dir, record.get("results_file"))
                    delivery = self.reporter.evaluation(eval_line_no, record, rows)
                except malformed as exc:
                    logger.error("evals.jsonl line %d skipped: %s", eval_line_no, exc)
            if delivery is None:
                self.evals_tail.commit(offset, line_no)
            else:
                self.in_flight["evals"] = (delivery, offset, line_no)  # settled by the loop's test: now if it is ready

    def _deliver_rollouts(self) -> None:
        if not self._settled("rollouts", self.rollouts_tail):
            return
        records, offset, line_no = self.rollouts_tail.peek(max_lines=2000, wanted=self.reporter.rollout_lines_wanted())
        delivery = self.reporter.rollouts(records, line_no) if line_no > self.rollouts_tail.line_no else None
        self._handed_over("rollouts", self.rollouts_tail, delivery, offset, line_no)

    def _deliver_discarded(self) -> None:
        if not self._settled("discarded", self.discarded_tail):
            return
        records, offset, line_no = self.discarded_tail.peek(max_lines=2000)
        self._handed_over("discarded", self.discarded_tail, self.reporter.discarded_rollouts(records) if records else None, offset, line_no)

    def deliver_train_logprobs(self) -> bool:
        """The trainer's per-token logprobs, attached to stored rollouts (importance ratios).
        False only when the reporter failed; a line whose stream lines are not delivered yet waits."""
        if not self.rollouts_tail.has_stream():
            return True  # no stream file yet: nothing they could attach to
        if len(self.train_logprobs_waiting) < TRAIN_LOGPROBS_WAITING_MAX:
            self.train_logprobs_waiting.extend(record for _, record in self.train_logprobs_tail.read(max_lines=2000))
        delivered = self.rollouts_tail.line_no
        ready = [r for r in self.train_logprobs_waiting if _int(r.get("consumed")) <= delivered]
        if not ready:
            return True
        if not self._attempt("train logprob delivery", "will retry", lambda: self.reporter.train_logprobs(ready)):
            return False
        self.train_logprobs_waiting = [r for r in self.train_logprobs_waiting if _int(r.get("consumed")) > delivered]
        return True

    def check_checkpoints(self) -> None:
        """Tell the reporter when checkpoints/ changed (a checkpoint saved, `latest` moved): the open
        run pages list checkpoints. One stat a poll: the folder's mtime moves with each entry."""
        try:
            mtime_ns: int | None = (self.run_dir / CHECKPOINTS_DIR).stat().st_mtime_ns
        except OSError:
            mtime_ns = None
        if not self.checkpoints_looked:
            self.checkpoints_looked, self.checkpoints_mtime_ns = True, mtime_ns
            return
        if mtime_ns == self.checkpoints_mtime_ns:
            return
        if self._attempt("reporting checkpoints", "will retry", self.reporter.checkpoints_changed):
            self.checkpoints_mtime_ns = mtime_ns

    def tick(self) -> None:
        self._attempt("alert checks", "will check again", self.reporter.tick)

    def resume_recorded(self) -> bool:
        """Whether lines may be delivered: always for a fresh run; for a resume, once the engine
        recorded what it rewinds (its resumes.jsonl line, written before its children start) or
        exited without doing so (it refused: the old lines are then delivered as they stand).
        Each new resume is reported once (`reporter.resumed`), before any line after it."""
        if not self.resume or self.resume_seen:
            return True
        found = read_resumes(self.run_dir)
        if len(found) <= self.resumes_reported and (self.process is None or self.process.poll() is None):
            return False
        self.resumes = found

        def report_new_resumes() -> None:
            for point in found[self.resumes_reported:]:
                self.reporter.resumed(point)
                self.resumes_reported += 1

        if not self._attempt("reporting the resume", "will retry", report_new_resumes):
            return False
        # This attempt's resume is recorded once for all: later polls deliver without asking again
        # (comparing counts again would hold every line back until the run ended: the resumed
        # attempt's charts froze at its checkpoint).
        self.resume_seen = True
        return True

    def check_status(self) -> None:
        if self.reported_running:
            return
        status = read_status(self.run_dir)  # None: not written yet, ask again next poll
        if status and status.state == "starting" and (status.detail or "") != self.reported_detail:
            detail = status.detail or ""  # e.g. a cluster run waiting for its placement group
            if self._attempt("reporting what the run waits for", "will retry", lambda: self.reporter.waiting(detail)):
                self.reported_detail = detail
        if status and status.state == "running":
            pid = status.pid or self.process.pid
            self.reported_running = self._attempt("reporting running", "will retry", lambda: self.reporter.running(pid))

    def signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def poll(self) -> bool:
        """One round of step 2; True when everything the run wrote so far is delivered."""
        delivered_all = self.deliver()
        self.check_status()
        self.check_checkpoints()
        self.tick()
        now = time.monotonic()
        if now >= self.next_cancel_check:
            self.next_cancel_check = now + self.cancel_poll_s
            if self.cancel_sent_at is None and self._cancel_requested():
                self.cancel()  # returns once the run has exited
        return delivered_all

    def cancel(self) -> None:
        """SIGTERM to the run's group (the launcher stops its children and writes `cancelled`),
        SIGKILL after `term_timeout_s`. What the run writes meanwhile is delivered by the final
        drain once it has exited."""
        assert self.process is not None
        logger.info("run dir %s: cancel requested, SIGTERM to group %d", self.run_dir, self.process.pid)
        self.cancel_sent_at = time.monotonic()
        if stop_process_groups([self.process], self.term_timeout_s):
            logger.warning("run dir %s: still alive %.0fs after SIGTERM; SIGKILL", self.run_dir, self.term_timeout_s)

    def _cancel_requested(self) -> bool:
        wanted = False

        def read_flag() -> None:
            nonlocal wanted
            wanted = self.reporter.cancel_requested()

        self._attempt("reading the cancel flag", "will ask again", read_flag)
        return wanted

    # -------------------------------------------------------------- 3. finish

    def supervise(self) -> Outcome:
        if self.process is None:
            self.start()
        assert self.process is not None
        with RunDirWatch() as watch:
            watch.add(self.run_dir)
            while self.process.poll() is None:
                polled_at = time.monotonic()
                self.poll()
                watch.wait(self.poll_s - (time.monotonic() - polled_at))  # early when the run wrote a line
                time.sleep(max(0.0, self.min_gap_s - (time.monotonic() - polled_at)))
        exit_code = self.process.returncode
        # The launcher should have stopped its children; anything left in the group is an orphan.
        self.signal_group(signal.SIGKILL)
        self.final_drain()
        return self.outcome(exit_code)

    def final_drain(self) -> None:
        """Deliver what the run wrote until it stopped, retrying for up to `drain_timeout_s`. A run
        with a private Redis (stream.redis_embedded) stopped it on exit with the rollouts of its
        last ~poll_s unread: the server is started again on its append-only file for the drain."""
        restarted = self._restart_embedded_stream()
        try:
            deadline = time.monotonic() + self.drain_timeout_s
            while not self.deliver() and time.monotonic() < deadline:
                time.sleep(0.02 if self.in_flight and not self.failing_since else min(2.0, self.poll_s * 4))
        finally:
            if restarted is not None:
                restarted.terminate()
                restarted.wait(10)
            # The file tails keep their files open between polls (JsonlTail); a read after this opens them again.
            for tail in (self.metrics_tail, self.evals_tail, self.rollouts_tail, self.train_logprobs_tail, self.discarded_tail):
                if isinstance(tail, JsonlTail):
                    tail.close()

    def _restart_embedded_stream(self) -> subprocess.Popen | None:
        tail = self.rollouts_tail
        if not isinstance(tail, RedisStreamTail) or tail.embedded_dir is None or not tail.embedded_dir.is_dir():
            return None
        try:
            process, _url = start_redis_server(tail.embedded_dir, password=tail.password())
        except (RuntimeError, OSError) as exc:  # the viewer keeps what it has; the run's outcome does not depend on it
            logger.warning("could not restart the run's Redis to read its last rollouts: %s", exc)
            return None
        return process

    def outcome(self, exit_code: int | None) -> Outcome:
        status = read_status(self.run_dir)
        state = status.state if status else None
        error = (status.error if status else None) or ""
        if self.cancel_sent_at is not None:
            return Outcome("cancelled", "", exit_code)
        if state in FINAL_STATES and not (state == "succeeded" and exit_code != 0):
            assert status is not None
            return Outcome(state, error if state != "succeeded" else "", exit_code, status.ended_reason or "", status.ended_detail or "")
        if exit_code == 0 and state is None:
            return Outcome("failed", "the run exited without writing status.json", exit_code)
        reason = f"exited with code {exit_code}" if exit_code is None or exit_code >= 0 else f"killed by signal {-exit_code}"
        tail = self.log_tail()
        return Outcome("failed", f"{error or 'the run ' + reason}" + (f"\n--- last log lines ---\n{tail}" if tail else ""), exit_code)

    def log_tail(self, max_chars: int = 2000) -> str:
        try:
            data = (self.run_dir / SUPERVISOR_LOG).read_bytes()[-max_chars:]
        except FileNotFoundError:
            return ""
        return data.decode(errors="replace").strip()
