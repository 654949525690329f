"""Metric mirrors (monitoring.mirror.sinks): every line of metrics.jsonl reaches W&B (offline
mode, read back from the run's own `.wandb` file) and TensorBoard (event files read back with
TensorBoard's EventAccumulator); a failing mirror is dropped without touching the run; a missing
package fails before the run starts, naming the field."""

from __future__ import annotations

import json
import logging
import struct
import time
from pathlib import Path

import pytest

from rl_core.config.monitoring import MirrorConfig
from rl_core.rundir.metrics import (
    JsonlSink,
    MetricsMirror,
    MirrorUnavailable,
    TensorBoardSink,
    WandbSink,
    check_mirror_sinks,
)
from rl_core.rundir.layout import METRICS_FILE, TENSORBOARD_DIR

# What the run's processes log, as they log it: steps out of order (an evaluation logs at the
# step it started), one process's keys at a time, a NaN (kept out, flagged).
LINES = [
    (1, {"train/loss": 0.5, "train/entropy": 1.25}),
    (1, {"success/mean": 0.25}),
    (2, {"train/loss": 0.375, "train/entropy": 1.0}),
    (1, {"eval/math/mean_at_k": 0.125}),
    (3, {"train/loss": float("nan"), "train/entropy": 0.75}),
]


def write_lines(run_dir: Path, lines=LINES) -> None:
    sink = JsonlSink(run_dir / METRICS_FILE)
    for step, metrics in lines:
        sink.log(step, metrics)
    sink.close()


def expected_scalars(lines=LINES) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in lines:
        for key, value in metrics.items():
            if value == value:
                out.setdefault(key, []).append((step, value))
            else:
                out.setdefault(f"nonfinite/{key}", []).append((step, 1.0))
    return out


def mirror_file(run_dir: Path, sinks: list[str]) -> MetricsMirror:
    mirror = MetricsMirror(run_dir, MirrorConfig(sinks=sinks, wandb_mode="offline"), "mirror-test", {"seed": 3}, poll_s=0.05)
    mirror.close()
    return mirror


# --- TensorBoard ------------------------------------------------------------------------


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(event.step, event.value) for event in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_mirror_holds_every_line(tmp_path: Path) -> None:
    write_lines(tmp_path)
    mirror = mirror_file(tmp_path, ["tensorboard"])
    assert mirror.lines == len(LINES)
    got = tensorboard_scalars(tmp_path / TENSORBOARD_DIR)
    want = expected_scalars()
    assert set(got) == set(want)
    for tag, points in want.items():
        # simple_value is float32: compare at that precision.
        assert [step for step, _ in got[tag]] == [step for step, _ in points], tag
        assert [value for _, value in got[tag]] == pytest.approx([value for _, value in points], rel=1e-6), tag


def test_mirror_follows_a_growing_file_and_resume_skips_mirrored_lines(tmp_path: Path) -> None:
    write_lines(tmp_path, LINES[:2])
    first = MetricsMirror(tmp_path, MirrorConfig(sinks=["tensorboard"]), poll_s=0.05)
    time.sleep(0.3)
    write_lines(tmp_path, LINES[2:3])  # appended while the mirror runs
    time.sleep(0.3)
    first.close()
    assert first.lines == 3
    # A resumed launch starts at the end of what the earlier attempt mirrored.
    write_lines(tmp_path, LINES[3:4])
    resumed = MetricsMirror(tmp_path, MirrorConfig(sinks=["tensorboard"]), from_end=True, poll_s=0.05)
    write_lines(tmp_path, LINES[4:])
    resumed.close()
    assert resumed.lines == 1
    got = tensorboard_scalars(tmp_path / TENSORBOARD_DIR)
    assert got["train/loss"] == [(1, 0.5), (2, 0.375)]
    assert got["train/entropy"][-1] == (3, 0.75)
    assert "eval/math/mean_at_k" not in got  # written between the attempts: neither mirrored it


# --- W&B offline --------------------------------------------------------------------------

BLOCK = 32 * 1024
HEADER = 7  # ":W&B", a 2-byte magic and a version byte
CHUNK_HEADER = 7  # crc32 (4), length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last)


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline run's `.wandb` file (W&B's block-framed log), read
    without the network: `wandb.Api` reads runs only from a server."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", HEADER
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # the block's tail is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        payload = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            break  # zero fill at the end of the last block
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: Path) -> list[dict[str, float]]:
    files = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    return wandb_history_of(files[0])


def wandb_history_of(path: Path) -> list[dict[str, float]]:
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def test_wandb_offline_mirror_holds_every_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_lines(tmp_path)
    mirror = mirror_file(tmp_path, ["wandb"])
    assert mirror.lines == len(LINES)
    assert all(guarded.sink is not None for guarded in mirror.mirrors), "the W&B mirror was dropped"
    history = wandb_history(tmp_path)
    assert len(history) == len(LINES)
    for row, (step, metrics) in zip(history, LINES):
        assert row["trainer_step"] == step
        for key, value in metrics.items():
            if value == value:
                assert row[key] == pytest.approx(value)
            else:
                assert key not in row and row[f"nonfinite/{key}"] == 1.0
    # Charted against trainer_step (W&B's own step only grows; lines arrive out of step order).
    metric_records = [r.metric for r in wandb_records(next(tmp_path.glob("wandb/offline-run-*/run-*.wandb")))
                      if r.WhichOneof("record_type") == "metric"]
    assert any(m.glob_name == "*" and m.step_metric == "trainer_step" for m in metric_records)


def test_wandb_sink_closes_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(tmp_path, "p", "offline", "closing", {"a": 1})
    sink.log(4, {"x": 2.0})
    sink.close()
    records = wandb_records(next(sink.run_dir.glob("run-*.wandb")))
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "exit" in kinds, kinds  # finish() wrote the run's end
    config = next(r.run.config for r in records if r.WhichOneof("record_type") == "run")  # the run's settings
    assert any(item.key == "a" and json.loads(item.value_json) == 1 for item in config.update)


def test_a_resumed_run_continues_its_wandb_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_lines(tmp_path, LINES[:3])
    mirror_file(tmp_path, ["wandb"])
    # The launcher's resume: the lines already mirrored are skipped, later ones are mirrored.
    resumed = MetricsMirror(tmp_path, MirrorConfig(sinks=["wandb"], wandb_mode="offline"), "mirror-test", from_end=True, poll_s=0.05)
    write_lines(tmp_path, LINES[3:])
    resumed.close()
    files = sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 2
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    for path in files:  # both attempts log to the one W&B run (`wandb sync` puts them together)
        assert path.name == f"run-{run_id}.wandb"
        assert [r.run.run_id for r in wandb_records(path) if r.WhichOneof("record_type") == "run"][0] == run_id
    steps = [[row["trainer_step"] for row in wandb_history_of(path)] for path in files]
    assert sorted(steps) == sorted([[step for step, _ in LINES[:3]], [step for step, _ in LINES[3:]]])


# --- failures -------------------------------------------------------------------------------


class Exploding:
    def __init__(self) -> None:
        self.calls = 0

    def log(self, step, metrics, t=None) -> None:
        self.calls += 1
        raise OSError("disk full")

    def close(self) -> None:
        raise OSError("disk full")


def test_a_failing_mirror_is_dropped_once_and_the_others_continue(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_lines(tmp_path)
    exploding = Exploding()

    def opener(name, run_dir, mirror, run_name, run_config):
        if name == "wandb":
            return exploding
        return TensorBoardSink(run_dir / TENSORBOARD_DIR)

    with caplog.at_level(logging.WARNING, logger="rl_core.rundir.metrics"):
        mirror = MetricsMirror(tmp_path, MirrorConfig(sinks=["wandb", "tensorboard"]), poll_s=0.05, opener=opener)
        mirror.close()
    assert exploding.calls == 1  # dropped at its first failure, not retried per line
    assert [r.message for r in caplog.records if "wandb" in r.message and "failed" in r.message].__len__() == 1
    assert mirror.lines == len(LINES)
    assert tensorboard_scalars(tmp_path / TENSORBOARD_DIR)["train/loss"] == [(1, 0.5), (2, 0.375)]


def test_a_mirror_that_cannot_start_never_blocks(tmp_path: Path) -> None:
    def opener(*_args):
        raise RuntimeError("no network")

    write_lines(tmp_path)
    started = time.monotonic()
    mirror = MetricsMirror(tmp_path, MirrorConfig(sinks=["wandb"]), poll_s=0.05, opener=opener)
    mirror.close()
    assert time.monotonic() - started < 5
    assert mirror.mirrors[0].sink is None and mirror.lines == len(LINES)


def test_a_missing_package_fails_before_the_run_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from rl_core.launch import launcher
    from rl_core.config.run_config import RunConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    check_mirror_sinks(["tensorboard"])  # installed: fine
    with pytest.raises(MirrorUnavailable, match=r"monitoring\.mirror\.sinks: 'wandb' but wandb is not installed"):
        check_mirror_sinks(["tensorboard", "wandb"])
    config = RunConfig.model_validate({"monitoring": {"mirror": {"sinks": ["wandb"]}}})
    with pytest.raises(launcher.LaunchError, match=r"monitoring\.mirror\.sinks"):
        launcher.validate_inputs(config)


# --- a real run -----------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_run_mirrors_every_metrics_line_to_both(tiny_model: Path, tmp_path: Path) -> None:
    """`python -m rl_core run` with both mirrors: every line any process wrote (trainer, actor,
    launcher's system metrics) is in TensorBoard at its step and in the W&B run's history."""
    import os
    import subprocess
    import sys

    from test_launcher import write_config

    from tests.metrics_file import read_metrics

    config = write_config(tmp_path / "config.yaml", tiny_model, monitoring={"mirror": {"sinks": ["wandb", "tensorboard"]}})
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    done = subprocess.run([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = read_metrics(out / METRICS_FILE)
    assert {"train/loss", "rollout/tokens_per_s"} <= {key for line in lines for key in line}  # trainer's and actor's
    want: dict[str, list[tuple[int, float]]] = {}
    for line in lines:
        for key, value in line.items():
            if key not in ("t", "step"):
                want.setdefault(key, []).append((int(line["step"]), value))
    got = tensorboard_scalars(out / TENSORBOARD_DIR)
    assert set(got) == set(want)
    for tag, points in want.items():
        assert [step for step, _ in got[tag]] == [step for step, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag
    assert len(wandb_history(out)) == len(lines)
