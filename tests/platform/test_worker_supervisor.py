"""The supervisor's file tailing and final-status rules, on real files (no database)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from workers.supervisor import JsonlTail, NullReporter, Outcome, RunSupervisor, read_problem_rows


def test_tail_returns_whole_lines_only_and_moves_only_on_commit(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.peek() == ([], 0, 0)  # no file yet
    path.write_text('{"step": 0, "a": 1}\n{"step": 1, "a"')
    records, offset, line_no = tail.peek()
    assert records == [(0, {"step": 0, "a": 1})] and line_no == 1
    assert tail.peek()[0] == records  # not committed: the same lines again (the DB was away)
    tail.commit(offset, line_no)
    assert tail.peek()[0] == []  # the torn line waits for its end
    with open(path, "a") as handle:
        handle.write(': 2}\nnot json\n[1, 2]\n{"step": 2, "a": 3}\n')
    records, offset, line_no = tail.peek()
    assert records == [(1, {"step": 1, "a": 2}), (4, {"step": 2, "a": 3})]  # bad lines skipped, numbering kept
    tail.commit(offset, line_no)
    assert tail.offset == path.stat().st_size and tail.line_no == 5


def test_tail_limits_a_batch(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(10)))
    tail = JsonlTail(path)
    records, offset, line_no = tail.peek(max_lines=4)
    assert [n for n, _ in records] == [0, 1, 2, 3] and line_no == 4
    tail.commit(offset, line_no)
    assert [n for n, _ in tail.peek()[0]] == list(range(4, 10))


def test_problem_rows_must_stay_inside_the_run_dir(tmp_path: Path) -> None:
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "r.jsonl").write_text('{"problem_id": "p"}\n\n')
    assert read_problem_rows(tmp_path, "eval/r.jsonl") == [{"problem_id": "p"}]
    assert read_problem_rows(tmp_path, None) == []
    with pytest.raises(ValueError, match="outside the run directory"):
        read_problem_rows(tmp_path, "../../etc/passwd")


@pytest.mark.parametrize(
    ("status", "exit_code", "cancelled", "expected"),
    [
        ({"state": "succeeded"}, 0, False, Outcome("succeeded", "", 0)),
        ({"state": "failed", "error": "boom"}, 1, False, Outcome("failed", "boom", 1)),
        ({"state": "cancelled"}, 0, False, Outcome("cancelled", "", 0)),
        ({"state": "running"}, 0, True, Outcome("cancelled", "", 0)),
        ({"state": "succeeded"}, 3, False, None),  # says succeeded but exited non-zero: failed
        (None, 0, False, Outcome("failed", "the run exited without writing status.json", 0)),
        ({"state": "running"}, -9, False, None),
    ],
)
def test_final_status_rules(tmp_path: Path, status, exit_code, cancelled, expected) -> None:
    if status is not None:
        (tmp_path / "status.json").write_text(json.dumps(status))
    supervisor = RunSupervisor(tmp_path, "", ["true"], NullReporter(), cwd=tmp_path)
    if cancelled:
        supervisor.cancel_sent_at = 1.0
    outcome = supervisor.outcome(exit_code)
    if expected is not None:
        assert outcome == expected
    else:
        assert outcome.status == "failed"
        assert ("killed by signal 9" in outcome.error) if exit_code == -9 else ("exited with code 3" in outcome.error)


def test_a_leftover_run_dir_is_moved_aside_not_mixed(tmp_path: Path) -> None:
    run_dir = tmp_path / "7"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "old": 1}\n')
    script = tmp_path / "engine.py"
    script.write_text("import sys, pathlib; out = pathlib.Path(sys.argv[4]); (out / 'status.json').write_text('{\"state\": \"succeeded\"}')\n")
    supervisor = RunSupervisor(run_dir, "name: x\n", [sys.executable, str(script)], NullReporter(), cwd=tmp_path, poll_s=0.05)
    assert supervisor.supervise() == Outcome("succeeded", "", 0)
    assert not (run_dir / "metrics.jsonl").exists() and (run_dir / "submitted_config.yaml").read_text() == "name: x\n"
    stale = [p for p in tmp_path.iterdir() if p.name.startswith("7.stale-")]
    assert len(stale) == 1 and (stale[0] / "metrics.jsonl").exists()


class RecordingReporter(NullReporter):
    """Keeps what was delivered, and when (whether the child was still running then)."""

    def __init__(self, child_running) -> None:
        self.child_running = child_running
        self.delivered: list[tuple[int, int, bool]] = []  # (line, step, child still running)
        self.resumes: list[int] = []

    def metrics(self, records):
        self.delivered.extend((n, int(r["step"]), self.child_running()) for n, r in records)

    def resumed(self, point):
        self.resumes.append(point.step)


# A resumed attempt as the launcher runs one: record the resume (rl_core.rundir.resume.record_resume,
# before any child starts), then log a step every 50 ms for a while, then end.
RESUMED_ENGINE = """
import json, sys, time, pathlib
out = pathlib.Path(sys.argv[4])
from rl_core.rundir.resume import record_resume
record_resume(out)
for step in range(11, 31):
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "step": step, "train/loss": 0.5}) + "\\n")
    time.sleep(0.05)
(out / "status.json").write_text('{"state": "succeeded"}')
"""


@pytest.mark.parametrize("attempt", range(3))  # the race the issue saw froze 2 of 5 tries: repeat
def test_a_resumed_run_is_delivered_while_it_runs_not_only_after_it_ends(tmp_path: Path, attempt: int) -> None:
    """Resumed from checkpoint step 10 after an attempt that logged steps 1..14: the steps the
    resumed attempt logs reach the reporter while it still runs (the charts stay live), the
    dead attempt's steps 11..14 never do."""
    from tests.conftest import REPO_ROOT

    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "step_000010"
    ckpt.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt"):
        (ckpt / name).write_bytes(b"x")
    (ckpt / "trainer_state.json").write_text(json.dumps({"version": 10, "stream_position": 80, "consumed": 80}))
    (run_dir / "checkpoints" / "latest").symlink_to("step_000010")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"t": 1.0, "step": s, "train/loss": 1.0}) + "\n" for s in range(1, 15)))
    (run_dir / "status.json").write_text('{"state": "cancelled"}')
    script = tmp_path / "engine.py"
    script.write_text(RESUMED_ENGINE)

    holder: dict = {}
    reporter = RecordingReporter(lambda: holder["supervisor"].process.poll() is None)
    supervisor = RunSupervisor(run_dir, "name: x\n", [sys.executable, str(script)], reporter, cwd=REPO_ROOT, poll_s=0.05, resume=True)
    holder["supervisor"] = supervisor
    assert supervisor.supervise() == Outcome("succeeded", "", 0)

    assert reporter.resumes == [10]
    steps = [step for _, step, _ in reporter.delivered]
    assert steps == list(range(1, 11)) + list(range(11, 31))  # the dead attempt's 11..14 are not delivered
    live = [step for _, step, running in reporter.delivered if running and step > 10]
    assert len(live) >= 10, f"only steps {live} of the resumed attempt were delivered while it ran"


def test_the_rollout_tail_reads_where_the_engine_writes(tmp_path: Path) -> None:
    # The supervisor's stream URL comes from the same rl_core function as the actor's and trainer's.
    from rl_core.config.run_config import StreamConfig
    from rl_core.rundir.layout import stream_redis_url
    from workers.stream_tail import FileStreamTail, RedisStreamTail, rollouts_tail

    embedded = rollouts_tail(tmp_path, "stream:\n  kind: redis\n  redis_embedded: true\n")
    assert isinstance(embedded, RedisStreamTail) and embedded.embedded_dir == tmp_path / "redis"
    assert embedded.url == stream_redis_url(StreamConfig(kind="redis", redis_embedded=True), tmp_path) == f"unix://{(tmp_path / 'redis' / 'redis.sock').resolve()}"
    shared = rollouts_tail(tmp_path, "stream:\n  kind: redis\n  redis_url: redis://10.0.0.5:6380/2\n")
    assert isinstance(shared, RedisStreamTail) and (shared.url, shared.embedded_dir) == ("redis://10.0.0.5:6380/2", None)
    default = rollouts_tail(tmp_path, "stream:\n  kind: redis\n")
    assert isinstance(default, RedisStreamTail) and default.url == StreamConfig().redis_url
    for not_redis in ("", "name: x\n", "stream:\n  kind: file\n", "stream: [1]\n", "- a list\n", "stream:\n  kind: kafka\n"):
        assert isinstance(rollouts_tail(tmp_path, not_redis), FileStreamTail), not_redis


def test_the_rollout_tail_reads_a_cluster_runs_password_protected_redis(tmp_path: Path) -> None:
    """A cluster run's Redis asks for its password on the unix socket too: the worker's tail reads
    it from redis/password (the launcher writes it, 0600); without it nothing can be read."""
    import redis

    from rl_core.rundir.layout import REDIS_DIR, REDIS_PASSWORD_FILE
    from rl_core.rundir.stream import redis_stream_key, start_redis_server
    from workers.stream_tail import RedisStreamTail

    run_dir = tmp_path / "run"
    process, url = start_redis_server(run_dir / REDIS_DIR, password="s3cret-pw")
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(url).ping()
        redis.Redis.from_url(url, password="s3cret-pw").xadd(redis_stream_key(run_dir), {"json": json.dumps({"sample_id": "a"})})
        blind = RedisStreamTail(url, redis_stream_key(run_dir), embedded_dir=run_dir / REDIS_DIR)
        assert blind.peek()[0] == []  # no password file yet: the server refuses, nothing is read
        (run_dir / REDIS_DIR / REDIS_PASSWORD_FILE).write_text("s3cret-pw")
        tail = RedisStreamTail(url, redis_stream_key(run_dir), embedded_dir=run_dir / REDIS_DIR)
        assert [record["sample_id"] for _, record in tail.peek()[0]] == ["a"]
    finally:
        process.terminate()
        process.wait(10)


# An engine that logs two steps 1.2 s apart and ends: far sooner than the supervisor's poll_s below.
PROMPT_ENGINE = """
import json, sys, time, pathlib
out = pathlib.Path(sys.argv[4])
for step in range(2):
    time.sleep(0.3 if step == 0 else 1.2)
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"t": time.time(), "step": step, "train/loss": 0.5}) + "\\n")
time.sleep(0.5)
(out / "status.json").write_text('{"state": "succeeded"}')
"""


def test_a_line_is_delivered_when_it_is_written_not_at_the_next_poll(tmp_path: Path) -> None:
    """With a 3 s poll, each line still reaches the reporter within a fraction of a second of
    being written: the supervisor is woken by the write (workers/run_dir_watch.py)."""
    delays: list[float] = []

    class TimingReporter(NullReporter):
        def metrics(self, records):
            delays.extend(time.time() - float(r["t"]) for _, r in records)

    script = tmp_path / "engine.py"
    script.write_text(PROMPT_ENGINE)
    supervisor = RunSupervisor(tmp_path / "run", "name: x\n", [sys.executable, str(script)], TimingReporter(), cwd=tmp_path, poll_s=3.0)
    assert supervisor.supervise() == Outcome("succeeded", "", 0)
    assert len(delays) == 2
    assert max(delays) < 1.0, f"lines waited {delays} s for the supervisor"


def test_a_new_checkpoint_is_reported_once_and_existing_ones_are_not_news(tmp_path: Path) -> None:
    class CheckpointReporter(NullReporter):
        def __init__(self) -> None:
            self.calls = 0
            self.fail = False

        def checkpoints_changed(self) -> None:
            if self.fail:
                raise ConnectionError("database away")
            self.calls += 1

    (tmp_path / "checkpoints" / "step_000010").mkdir(parents=True)  # a resumed run's earlier checkpoint
    reporter = CheckpointReporter()
    supervisor = RunSupervisor(tmp_path, "", ["true"], reporter, cwd=tmp_path)
    supervisor.check_checkpoints()
    assert reporter.calls == 0
    (tmp_path / "checkpoints" / "step_000020").mkdir()
    os.utime(tmp_path / "checkpoints", ns=(1, 1))  # a distinct mtime even on a coarse clock
    reporter.fail = True
    supervisor.check_checkpoints()  # not delivered: said again on the next poll
    reporter.fail = False
    supervisor.check_checkpoints()
    supervisor.check_checkpoints()
    assert reporter.calls == 1


def test_the_run_dir_watch_names_the_run_that_wrote_a_watched_file(tmp_path: Path) -> None:
    from workers.run_dir_watch import RunDirWatch

    quiet, busy = tmp_path / "quiet", tmp_path / "busy"
    quiet.mkdir()
    busy.mkdir()
    with RunDirWatch() as watch, RunDirWatch() as other:
        assert watch.active  # Linux: inotify
        watch.add(quiet)
        watch.add(busy)
        other.add(busy)  # a second supervisor of the same directory is told too
        (quiet / "trainer_progress.json").write_text("{}")  # not a file the pages wait for
        assert watch.wait(0.2) == set()

        def write_later() -> None:
            time.sleep(0.2)
            with open(busy / "metrics.jsonl", "a") as handle:
                handle.write("{}\n")

        threading.Thread(target=write_later).start()
        started = time.monotonic()
        assert watch.wait(5.0) == {busy}
        assert time.monotonic() - started < 2.0
        assert other.wait(1.0) == {busy}
        other.close()
        with open(busy / "metrics.jsonl", "a") as handle:
            handle.write("{}\n")
        assert watch.wait(2.0) == {busy}  # the other's close left this watch's descriptor in place


def test_every_reporter_implements_the_whole_interface_the_supervisor_calls() -> None:
    import inspect

    from workers.supervisor import Reporter
    from workers.tasks import PlatformReporter

    declared = {name: inspect.signature(member) for name, member in vars(Reporter).items()
                if callable(member) and not name.startswith("_")}
    assert {"metrics", "evaluation", "rollouts", "train_logprobs", "running", "waiting", "resumed",
            "checkpoints_changed", "tick", "cancel_requested"} <= set(declared)
    for implementation in (PlatformReporter, NullReporter):
        for name, signature in declared.items():
            member = getattr(implementation, name, None)
            assert callable(member), f"{implementation.__name__} lacks {name}"
            assert list(inspect.signature(member).parameters) == list(signature.parameters), (implementation.__name__, name)


def test_metrics_lines_being_written_hold_the_tail_not_the_other_deliveries(tmp_path: Path) -> None:
    """A reporter that writes metrics in the background (the platform's process-wide writer): the
    supervisor goes on with the rollouts meanwhile, says it has not delivered everything, moves its
    metrics tail only once the write is settled, and sends the lines again if it failed."""

    class Write:
        def __init__(self) -> None:
            self.done = False
            self.error: Exception | None = None

        def ready(self) -> bool:
            return self.done

        def settle(self) -> None:
            if self.error is not None:
                raise self.error

    class BackgroundReporter(NullReporter):
        def __init__(self) -> None:
            self.writes: list[tuple[list[int], Write]] = []
            self.rollout_lines = 0

        def metrics(self, records):
            write = Write()
            self.writes.append(([n for n, _ in records], write))
            return write

        def rollouts(self, records, lines_read):
            self.rollout_lines = lines_read

    reporter = BackgroundReporter()
    supervisor = RunSupervisor(tmp_path, "", [], reporter, cwd=tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n')
    (tmp_path / "stream").mkdir()
    (tmp_path / "stream" / "rollouts.jsonl").write_text('{"x": 1}\n')
    assert supervisor.deliver() is False  # the write is under way
    assert reporter.rollout_lines == 1 and supervisor.metrics_tail.line_no == 0
    assert supervisor.deliver() is False and len(reporter.writes) == 1  # not sent twice while it is written
    reporter.writes[0][1].error, reporter.writes[0][1].done = ConnectionError("database away"), True
    assert supervisor.deliver() is False  # failed: said once, the tail stays
    assert supervisor.deliver() is False  # and on the next poll the same lines go again
    assert [lines for lines, _ in reporter.writes] == [[0, 1], [0, 1]] and supervisor.metrics_tail.line_no == 0
    reporter.writes[1][1].done = True
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 2, "a": 3}\n')
    assert supervisor.deliver() is False  # settled: the tail moves, and the new line is being written
    assert supervisor.metrics_tail.line_no == 2 and reporter.writes[2][0] == [2]
    reporter.writes[2][1].done = True
    assert supervisor.deliver() is True and supervisor.metrics_tail.line_no == 3
