"""The run directory's records and the server ready line (rl_core/rundir/layout.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rl_core.rundir import layout as rd


def test_status_round_trips_with_the_documented_keys(tmp_path: Path) -> None:
    assert rd.read_status(tmp_path) is None
    rd.write_status(tmp_path, "failed", "boom")
    raw = json.loads((tmp_path / rd.STATUS_FILE).read_text())
    assert set(raw) == {"state", "error", "pid", "updated", "detail", "ended_reason", "ended_detail"}
    status = rd.read_status(tmp_path)
    assert status is not None and (status.state, status.error, status.pid) == ("failed", "boom", raw["pid"])
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temp file


def test_status_written_by_hand_with_fewer_keys_still_reads(tmp_path: Path) -> None:
    (tmp_path / rd.STATUS_FILE).write_text('{"state": "succeeded"}')
    assert rd.read_status(tmp_path) == rd.RunStatusRecord(state="succeeded")


def test_unreadable_records_read_as_not_yet_written(tmp_path: Path) -> None:
    (tmp_path / rd.STATUS_FILE).write_text('{"state": "runn')  # a non-atomic writer, mid-write
    (tmp_path / rd.PROGRESS_FILE).write_text('["not", "a", "record"]')
    assert rd.read_status(tmp_path) is None and rd.read_progress(tmp_path) is None


def test_progress_round_trip_and_clearing_a_previous_attempt(tmp_path: Path) -> None:
    progress = rd.TrainerProgress(version=3, consumed=24, done=True, max_steps=3, t=1.5)
    rd.write_progress(tmp_path, progress)
    assert json.loads((tmp_path / rd.PROGRESS_FILE).read_text()) == {"version": 3, "consumed": 24, "done": True, "max_steps": 3, "t": 1.5}
    assert rd.read_progress(tmp_path) == progress
    rd.request_stop(tmp_path, "max_wall_time_s reached")
    assert rd.stop_requested(tmp_path)
    rd.clear_previous_attempt(tmp_path)
    assert rd.read_progress(tmp_path) is None and not rd.stop_requested(tmp_path)


def test_ready_line_parses_back_and_other_lines_do_not() -> None:
    assert rd.parse_ready_line(rd.ready_line("http://127.0.0.1:8001")) == "http://127.0.0.1:8001"
    assert rd.parse_ready_line(rd.ready_line("http://h:1") + "\n") == "http://h:1"
    for line in ("", "INFLIGHT_SERVER_READY", "INFO: INFLIGHT_SERVER_READY http://h:1", "INFLIGHT_SERVER_READYX http://h:1"):
        assert rd.parse_ready_line(line) is None


def test_the_layout_module_imports_neither_torch_nor_django() -> None:
    code = "import sys, rl_core.rundir.layout; print(sorted(m for m in ('torch', 'django') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_processes_started_before_the_servers_read_their_urls_once_written(tmp_path: Path) -> None:
    import threading

    writer = threading.Timer(0.2, rd.write_servers, args=(tmp_path, ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]))
    writer.start()
    assert rd.wait_for_servers(tmp_path, timeout_s=10) == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    # A resume's new servers have new addresses: the old list never survives into the next attempt.
    rd.clear_previous_attempt(tmp_path)
    try:
        rd.wait_for_servers(tmp_path, timeout_s=0.1)
        raise AssertionError("a cleared servers.json was read")
    except TimeoutError as exc:
        assert rd.SERVERS_FILE in str(exc)


def test_checkpoint_names_round_trip_and_refuse_other_names(tmp_path: Path) -> None:
    # The trainer writes the name, the resume check and the platform's access checks parse it.
    assert rd.checkpoint_dir_name(7) == "step_000007"
    assert rd.checkpoint_dir_name(1234567) == "step_1234567"
    for step in (0, 7, 999_999, 1234567):
        assert rd.checkpoint_step(rd.checkpoint_dir_name(step)) == step
    for other in (rd.LATEST_CHECKPOINT_LINK, ".step_000007.tmp", "step_", "step_12a", "step_0000000000001", "xstep_000001"):
        assert rd.checkpoint_step(other) is None
    assert rd.checkpoint_dir(tmp_path, 3) == tmp_path / rd.CHECKPOINTS_DIR / "step_000003"
