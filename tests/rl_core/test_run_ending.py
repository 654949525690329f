"""How a real run ends and says why (issue 33): a run its wall-time budget stops reports
`ended_reason: wall_time` with its step, not a bare `succeeded` (defect 7); a role that stops
answering (SIGSTOP: alive, port open, answering nothing) is reported, then fails the run naming
it after `monitoring.hang_limit_s` (defect 2)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from rl_core.rundir.layout import read_status
from tests.metrics_file import read_metrics
from tests.rl_core.test_launcher import assert_all_gone, children_of, command_words, start_run, status, trained_steps, wait_for, write_config


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_wall_time_stop_says_so_with_its_step(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 1000}, max_wall_time_s=45)
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        assert launcher.wait(300) == 0  # the budget is what the user asked for: its checkpoint and evaluation are written
    finally:
        if launcher.poll() is None:
            launcher.kill()
    final = read_status(out)
    assert final is not None and final.state == "succeeded"
    assert final.ended_reason == "wall_time"
    steps = trained_steps(out)
    assert final.ended_detail == f"stopped by its wall-time budget (max_wall_time_s 45 s) at step {steps} of 1000"
    assert steps < 1000
    assert f"run succeeded ({final.ended_detail})" in (launcher.stdout.read() if launcher.stdout else "")


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("role", ["server0", "trainer"])
def test_a_stopped_role_is_reported_then_fails_the_run_naming_it(tiny_model: Path, tmp_path: Path, role: str) -> None:
    hang_limit_s = 25
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 500}, monitoring={"hang_limit_s": hang_limit_s})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    stopped = None
    try:
        wait_for(lambda: trained_steps(out) >= 1, 240, "a first training step")
        command_word = "serve" if role.startswith("server") else "trainer"
        stopped = next(p for p in children_of(launcher.pid) if command_word in command_words(p) and "rl_core" in command_words(p))
        others = [p for p in children_of(launcher.pid) if p.pid != stopped.pid]
        stopped_at = time.monotonic()
        stopped.send_signal(signal.SIGSTOP)  # alive, its port open, answering nothing
        assert launcher.wait(120) == 1
        failed_after = time.monotonic() - stopped_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if stopped is not None and stopped.is_running():
            stopped.send_signal(signal.SIGCONT)
    final = status(out)
    assert final["state"] == "failed" and final["ended_reason"] == "hung", final
    assert final["error"].startswith(f"{role} stopped answering"), final["error"]
    assert final["ended_detail"].startswith(f"failed: {role} stopped answering at step ")
    assert f"monitoring.hang_limit_s {hang_limit_s}" in final["error"]
    assert hang_limit_s <= failed_after < hang_limit_s + 30
    # Before failing, the launcher's lines said which role was silent: the platform's `stalled` rule reads them.
    reported = [record for record in read_metrics(out / "metrics.jsonl") if f"watchdog/silent_s/{role}" in record]
    assert reported and max(record[f"watchdog/silent_s/{role}"] for record in reported) < hang_limit_s + 5
    assert_all_gone(others + [stopped])
