"""scripts/gpu_window.sh --device cpu: the GPU window's every stage, at the tiny shape on a CPU, so
the script the rare GPU machine runs first cannot rot between its visits."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest

STAGES = ("build_model", "engine", "weight_update", "runs", "deepspeed")
# The figures each stage exists for (the GPU-only ones, utilisation and GPU memory, aside).
FIGURES = {
    "engine": ("engine_tokens_per_s", "hf_generate_tokens_per_s", "engine_speedup_vs_hf"),
    "weight_update": ("update_pause_vs_device_copy",),
    "runs": ("real_size_async_step_s", "real_size_sync_step_s", "real_size_update_pause_vs_broadcast",
             "real_size_peak_rss_gib_trainer", "real_size_peak_rss_gib_server", "real_size_trained_tokens_per_step"),
    "deepspeed": ("trainer_step_s", "trainer_step_tokens_per_s"),
}


def read_results(path: Path) -> dict[str, str]:
    results = {}
    for line in path.read_text().splitlines():
        _, name, value = line.split(maxsplit=2)
        results[name] = value
    return results


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.timeout(900)
def test_the_gpu_window_runs_every_stage_on_a_cpu(repo_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "scripts/gpu_window.sh", "--device", "cpu"], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=880)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    results = read_results(out / "results.txt")
    for stage in STAGES:
        assert results.get(f"window_stage_{stage}_ok") == "1", stage
        assert float(results[f"window_stage_{stage}_s"]) > 0
    for stage, names in FIGURES.items():
        for name in names:
            assert name in results, f"stage {stage} printed no RESULT {name}"
            value = float(results[name])
            assert math.isfinite(value) and value > 0, (name, value)
    log = (out / "window.log").read_text()
    assert "preflight: nothing missing" in log and "----- stage runs -----" in log
    # Printed as they came too (the GPU machine hands back the command's output tail).
    assert all(f"RESULT {name} " in done.stdout for name in results)


def test_a_wrong_device_is_refused_naming_the_flag(repo_root: Path, tmp_path: Path) -> None:
    done = subprocess.run(["bash", "scripts/gpu_window.sh", "--device", "tpu"], cwd=repo_root,
                          env={**os.environ, "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--device must be cuda[:N] or cpu" in done.stderr
