"""How a real run ends and says why (issue 33): a run its wall-time budget stops reports
`ended_reason: wall_time` with its step, not a bare `succeeded` (defect 7); a role that stops
answering (SIGSTOP: alive, port open, answering nothing) is reported, then fails the run naming
it after `monitoring.hang_limit_s` (defect 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_core.run_dir import read_status
from tests.rl_core.test_launcher import start_run, trained_steps, write_config


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
