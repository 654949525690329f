"""Resume bookkeeping (rl_core/rundir/resume.py): a missing or unreadable checkpoint is refused with
its name, and the lines a resume rewinds are recorded and recognised. The SIGKILL → resume
run through the platform is tests/platform/test_run_actions_stack.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rl_core.launch.launcher import LaunchError, prepare_run_dir
from rl_core.config.run_config import RunConfig
from rl_core.rundir.resume import ResumeError, check_checkpoint, is_superseded, read_resumes, record_resume


def fake_checkpoint(run_dir: Path, step: int, *, state: dict | None = None) -> Path:
    folder = run_dir / "checkpoints" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x")
    (folder / "optimizer.pt").write_bytes(b"x")
    state = state if state is not None else {"version": step, "stream_position": {"kind": "file", "offset": 0, "count": 0}, "consumed": 0}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    link = run_dir / "checkpoints" / "latest"
    if link.is_symlink():
        link.unlink()
    os.symlink(folder.name, link)
    return folder


def test_no_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ResumeError, match="checkpoints/latest does not exist"):
        check_checkpoint(tmp_path)


def test_deleted_checkpoint_is_named(tmp_path: Path) -> None:
    folder = fake_checkpoint(tmp_path, 4)
    import shutil

    shutil.rmtree(folder)
    with pytest.raises(ResumeError, match=r"checkpoint checkpoints/step_000004 .* is missing"):
        check_checkpoint(tmp_path)


@pytest.mark.parametrize("broken", ["optimizer.pt", "trainer_state.json"])
def test_unreadable_checkpoint_is_named(tmp_path: Path, broken: str) -> None:
    folder = fake_checkpoint(tmp_path, 6)
    if broken == "optimizer.pt":
        (folder / broken).unlink()
    else:
        (folder / broken).write_text("{not json")
    with pytest.raises(ResumeError, match=rf"checkpoints/step_000006 is unreadable: {broken}"):
        check_checkpoint(tmp_path)


def test_launcher_refuses_resume_without_usable_checkpoint_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"t": 1, "step": 1, "train/loss": 0.5}\n')
    fake_checkpoint(tmp_path, 2, state={"version": 2})  # no stream position: unreadable
    with pytest.raises(LaunchError, match="checkpoints/step_000002 is unreadable"):
        prepare_run_dir(tmp_path, RunConfig(), resume=True)
    assert not (tmp_path / "resumes.jsonl").exists() and not (tmp_path / "config.yaml").exists()


def test_record_resume_counts_lines_closes_torn_ones_and_marks_rewound_lines(tmp_path: Path) -> None:
    lines = [{"t": 1, "step": s, "train/loss": 0.1} for s in (1, 2, 3, 4, 5)]
    # The last line was torn by a SIGKILL: it is closed so the next write starts a line.
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"t": 1, "st')
    (tmp_path / "trainer_shards.jsonl").write_text("".join(json.dumps({"step": s, "rank": 0, "sample_ids": [str(s)]}) + "\n" for s in (1, 2, 3, 4, 5)))
    fake_checkpoint(tmp_path, 3)
    point = record_resume(tmp_path)
    assert point.step == 3 and point.checkpoint == "checkpoints/step_000003"
    assert point.lines == {"metrics.jsonl": 6, "evals.jsonl": 0, "trainer_shards.jsonl": 5}
    assert (tmp_path / "metrics.jsonl").read_bytes().endswith(b"\n")
    resumes = read_resumes(tmp_path)
    assert resumes == [point]
    # Steps 4 and 5 of the dead attempt are superseded; the same steps logged later are not.
    assert [is_superseded(resumes, "metrics.jsonl", i, r["step"]) for i, r in enumerate(lines)] == [False, False, False, True, True]
    assert not is_superseded(resumes, "metrics.jsonl", 6, 4)
    assert is_superseded(resumes, "trainer_shards.jsonl", 4, 5) and not is_superseded(resumes, "trainer_shards.jsonl", 2, 3)
    # A second resume (from a later checkpoint) rewinds only what came after its own step.
    fake_checkpoint(tmp_path, 5)
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        for step in (4, 5, 6):
            handle.write(json.dumps({"t": 2, "step": step}) + "\n")
    record_resume(tmp_path)
    resumes = read_resumes(tmp_path)
    assert [is_superseded(resumes, "metrics.jsonl", n, s) for n, s in ((6, 4), (7, 5), (8, 6), (9, 6))] == [False, False, True, False]
