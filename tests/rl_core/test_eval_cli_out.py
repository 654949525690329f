"""`python -m rl_core eval --out`: a folder gets the default file name inside it (it ended in an
IsADirectoryError traceback after the whole evaluation), and a path that cannot be written is
refused before the evaluation starts, naming --out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _eval(model: Path, out: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rl_core", "eval", "--model", str(model), "--benchmark", "synthetic",
               "--k", "1", "--max-problems", "2", "--max-new-tokens", "2", "--out", out]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300)


def test_out_folder_gets_the_results_file_inside(untrained_tiny_model: Path, tmp_path: Path, repo_root: Path) -> None:
    for folder, argument in ((tmp_path / "existing", str(tmp_path / "existing")), (tmp_path / "new", f"{tmp_path / 'new'}/")):
        if folder.name == "existing":
            folder.mkdir()
        done = _eval(untrained_tiny_model, argument, repo_root)
        assert done.returncode == 0, done.stderr
        written = folder / f"{untrained_tiny_model.name}-synthetic.jsonl"
        assert json.loads(done.stdout.strip().splitlines()[-1])["results_file"] == str(written)
        assert len(written.read_text().splitlines()) == 2
        assert "Traceback" not in done.stderr


def test_an_unwritable_out_is_refused_before_evaluating(untrained_tiny_model: Path, tmp_path: Path, repo_root: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = _eval(untrained_tiny_model, str(blocker / "results.jsonl"), repo_root)
    assert done.returncode == 2 and "--out" in done.stderr and "is a file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "mean@" not in done.stdout  # refused, not evaluated
