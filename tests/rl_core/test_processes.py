"""Process plumbing (rl_core/common/processes.py) and the JSONL tail (rl_core/common/jsonl_tail.py)."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_core.common.jsonl_tail import JsonlTail
from rl_core.common.processes import die_with_parent, free_port, run_event_loop, stop_process_groups


def test_free_port_can_be_bound() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def test_frozen_startup_objects_are_out_of_the_collectors_reach() -> None:
    # Run in a fresh interpreter: freezing is process-wide and would outlive this test.
    code = (
        "import gc, torch; from rl_core.common.processes import freeze_startup_objects;"
        "before = len(gc.get_objects()); freeze_startup_objects();"
        "print(before, len(gc.get_objects()), gc.get_freeze_count())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, tracked_after, frozen = map(int, out.stdout.split())
    assert before > 50_000  # torch alone brings this many objects
    assert tracked_after < 1_000 and frozen >= before // 2


def test_the_event_loop_is_uvloop_where_it_is_installed() -> None:
    import asyncio

    uvloop = pytest.importorskip("uvloop")

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    assert issubclass(run_event_loop(loop_type()), uvloop.Loop)


def test_the_wrapped_command_keeps_its_pid_and_output() -> None:
    # The wrapper execs the command in place: the pid the parent holds (and signals, and waits
    # for) is the command's own, and what it prints comes through.
    process = subprocess.Popen(die_with_parent([sys.executable, "-c", "import os; print(os.getpid())"]), stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and int(out.strip()) == process.pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_the_child_gets_sigterm_when_its_parent_dies(tmp_path: Path) -> None:
    # A middle process starts a long sleeper through die_with_parent, then is SIGKILLed.
    middle_code = (
        "import subprocess, sys, time; from rl_core.common.processes import die_with_parent;"
        "p = subprocess.Popen(die_with_parent([sys.executable, '-c', 'import time; time.sleep(60)']));"
        "print(p.pid, flush=True); time.sleep(60)"
    )
    middle = subprocess.Popen([sys.executable, "-c", middle_code], stdout=subprocess.PIPE, text=True)
    assert middle.stdout is not None
    child = int(middle.stdout.readline())
    time.sleep(0.5)  # the wrapper has exec'd the sleeper by now
    middle.send_signal(signal.SIGKILL)
    middle.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        stat = Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0] if Path(f"/proc/{child}/stat").exists() else "X"
        if stat == "Z":
            return  # dead, waiting to be reaped by init
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its parent")


def test_tail_returns_complete_lines_only_and_resumes_after_them(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # no file yet
    path.write_text(json.dumps({"step": 0}) + "\n" + '{"step": 1')  # a torn last line
    assert tail.read() == [(0, {"step": 0})]
    with open(path, "a") as handle:
        handle.write("}\nnot json\n" + json.dumps({"step": 2}) + "\n")
    assert tail.read() == [(1, {"step": 1}), (3, {"step": 2})]
    assert tail.bad_lines == 1 and tail.read() == []


def test_tail_opens_its_file_once_and_a_poll_with_nothing_new_reads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker polls five files per run many times a second, most of them unchanged: opening and
    # reading each one every time was a fifth of a worker's CPU at 200 live runs.
    import builtins
    import os

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0}) + "\n")
    opened: list[str] = []
    reads: list[int] = []
    real_open, real_pread = builtins.open, os.pread
    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: opened.append(str(file)) or real_open(file, *a, **k))
    monkeypatch.setattr(os, "pread", lambda fd, n, offset: reads.append(n) or real_pread(fd, n, offset))
    tail = JsonlTail(path)
    assert tail.read() == [(0, {"step": 0})]
    for _ in range(5):
        assert tail.read() == []
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": 1}) + "\n")
    assert tail.read() == [(1, {"step": 1})]
    assert opened.count(str(path)) == 2  # the tail's own handle, once, and this test's append
    assert len(reads) == 2  # only when the file had grown
    tail.close()
    with open(path, "a") as handle:
        handle.write(json.dumps({"step": 2}) + "\n")
    assert tail.read() == [(2, {"step": 2})]  # closed: opened again to read on


def test_tail_peek_moves_only_when_committed(tmp_path: Path) -> None:
    path = tmp_path / "evals.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(3)))
    tail = JsonlTail(path)
    records, offset, line_no = tail.peek(max_lines=2)
    assert [n for n, _ in records] == [0, 1] and tail.peek(max_lines=2)[0] == records  # not committed: same again
    tail.commit(offset, line_no)
    assert tail.read() == [(2, {"i": 2})]


def test_tail_counts_and_logs_a_bad_line_once_however_often_it_is_peeked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The supervisor peeks again and again while the database refuses a batch: the bad line in
    # it is one bad line, said once.
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    tail = JsonlTail(path)
    with caplog.at_level(logging.WARNING, logger="rl_core.common.jsonl_tail"):
        for _ in range(3):
            records, offset, line_no = tail.peek()
            assert [n for n, _ in records] == [0, 2]
        assert tail.bad_lines == 1
        tail.commit(offset, line_no)
        with open(path, "a") as handle:
            handle.write("[1]\n")
        assert tail.read() == [] and tail.read() == []
    assert tail.bad_lines == 2
    assert [r.getMessage() for r in caplog.records] == ["metrics.jsonl line 1 is not a JSON object; skipped",
                                                         "metrics.jsonl line 3 is not a JSON object; skipped"]


def test_strict_tail_refuses_a_bad_line_instead_of_skipping_it(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"i": 0}\nnot json\n')
    tail = JsonlTail(path, strict=True)
    with pytest.raises(ValueError, match=r"rollouts.jsonl line 1 \(byte 9\): not a JSON object"):
        tail.peek()
    assert tail.offset == 0 and tail.line_no == 0  # nothing was delivered


def test_tail_reads_the_nan_and_infinity_pythons_json_writes_as_before(tmp_path: Path) -> None:
    """Lines are read by orjson first, which refuses NaN and Infinity; json.dumps writes them for a
    non-finite metric, and such a line is still read, not skipped as bad."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": float("nan"), "grad": float("inf")}) + "\n" + '{"step": 2, "loss": 0.5}\n')
    tail = JsonlTail(path)
    records = tail.read()
    assert [line for line, _ in records] == [0, 1] and tail.bad_lines == 0
    first = records[0][1]
    assert math.isnan(first["loss"]) and first["grad"] == float("inf") and records[1][1] == {"step": 2, "loss": 0.5}


def _group_with_a_child(ignore_sigterm: bool) -> tuple[subprocess.Popen, int]:
    """A session leader that starts a sleeping child of its own; (leader, child pid).

    The pid is printed only once the child ignores SIGTERM: a child still starting Python when the group's
    SIGTERM arrives dies of it (CI saw that on a loaded machine), which is not what the test is about."""
    child = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    code = (
        "import signal, subprocess, sys, time;"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN);" if ignore_sigterm else "")
        + f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE); c.stdout.readline();"
        "print(c.pid, flush=True); time.sleep(60)"
    )
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert leader.stdout is not None
    return leader, int(leader.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # dead, waiting for init to reap it


def test_stop_process_groups_terms_then_kills_the_whole_group() -> None:
    polite, polite_child = _group_with_a_child(ignore_sigterm=False)
    stubborn, stubborn_child = _group_with_a_child(ignore_sigterm=True)
    started = time.monotonic()
    killed = stop_process_groups([polite, stubborn], timeout_s=1.0, kill_wait_s=5.0)
    assert killed == [stubborn.pid]  # the polite leader left on SIGTERM, within the grace period
    assert 1.0 <= time.monotonic() - started < 5.0
    assert polite.poll() == -signal.SIGTERM and stubborn.poll() == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while not _gone(stubborn_child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(stubborn_child)  # SIGKILL went to the group, not only its leader
    # The polite leader's child ignores SIGTERM and outlived it: only kill_orphans ends it.
    assert not _gone(polite_child)
    assert stop_process_groups([polite], timeout_s=1.0, kill_orphans=True) == []
    deadline = time.monotonic() + 5
    while not _gone(polite_child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(polite_child)


SEGMENT_HOLDER = """
import signal, sys, time
from multiprocessing import shared_memory
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopped only by SIGKILL, as a wedged vLLM engine core is
segment = shared_memory.SharedMemory(create=True, size=1 << 20)
print(segment.name, flush=True)
time.sleep(600)
"""


def test_stopping_a_group_removes_the_shared_memory_its_killed_processes_left() -> None:
    # A SIGKILLed group's multiprocessing segments (vLLM's message queues: ~420 MB of /dev/shm per
    # server) outlive it: the resource tracker that would remove them is killed with the group.
    holder = subprocess.Popen([sys.executable, "-c", SEGMENT_HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", SEGMENT_HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        segment = Path("/dev/shm") / holder.stdout.readline().strip()
        untouched = Path("/dev/shm") / bystander.stdout.readline().strip()
        assert segment.exists() and untouched.exists()
        assert stop_process_groups([holder], timeout_s=0.5, kill_wait_s=5.0) == [holder.pid]
        assert not segment.exists()
        assert untouched.exists()  # another group's segment, still mapped by its live owner
    finally:
        stop_process_groups([bystander], timeout_s=0.5, kill_wait_s=5.0)
    assert not untouched.exists()


# A group member that maps a segment and takes a moment to die on SIGTERM (as a vLLM server's engine
# core does), started by a leader that exits at once.
SLOW_SEGMENT_CHILD = """
import signal, sys, time
from multiprocessing import shared_memory
segment = shared_memory.SharedMemory(create=True, size=1 << 20)
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), sys.exit(0)))
print(segment.name, flush=True)
time.sleep(600)
"""
SLOW_SEGMENT_LEADER = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {SLOW_SEGMENT_CHILD!r}], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(600)
"""


def test_a_segment_mapped_by_a_slowly_dying_group_member_is_removed_once_it_has_died() -> None:
    # Swept as soon as the leader had exited, the segment was still mapped by the dying member,
    # skipped, and outlived everyone: bench/weight_update_vllm.py --smoke left ~420 MB of /dev/shm.
    leader = subprocess.Popen([sys.executable, "-c", SLOW_SEGMENT_LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    segment = Path("/dev/shm") / leader.stdout.readline().strip()
    assert segment.exists()
    assert stop_process_groups([leader], timeout_s=5.0, kill_wait_s=5.0) == []
    assert not segment.exists()
