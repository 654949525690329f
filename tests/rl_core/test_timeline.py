"""The pipeline's timeline (`rl_core/rundir/timeline.py`): what each role records, bounded; and a real
run's timeline against its metrics.jsonl: every weight update is there, and nothing overlaps that
cannot (a server's pauses and decode spans, a trainer rank's phases)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from rl_core.rundir.layout import timeline_path
from rl_core.rundir.timeline import (
    DECODE_GAP_S,
    DECODE_SPAN_MAX_S,
    ActorTimeline,
    ServerTimeline,
    TimelineSpan,
    TimelineWriter,
    TrainerTimeline,
    lane_files,
    read_lane,
)
from tests.metrics_file import read_metrics


def lane(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return read_lane(timeline_path(run_dir, name))[0]


def overlapping(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of consecutive spans (by start) where the later starts before the earlier ends."""
    ordered = sorted(spans, key=lambda s: (s["start"], s["end"]))
    return [(a, b) for a, b in zip(ordered, ordered[1:]) if b["start"] < a["end"] - 1e-4]


def test_decode_steps_coalesce_into_spans_and_a_pause_closes_the_open_one(tmp_path: Path) -> None:
    server = ServerTimeline(TimelineWriter(tmp_path, "server", "server0"))
    t = 1000.0
    for i in range(5):  # back to back: one span
        server.step(t + 0.01 * i, t + 0.01 * (i + 1), running=3 + i)
    server.pause(t + 0.06, t + 0.07, version=4)  # ends the open span first
    server.step(t + 0.07, t + 0.08, running=2)
    server.step(t + 0.08 + 2 * DECODE_GAP_S, t + 0.09 + 2 * DECODE_GAP_S, running=1)  # after a gap: a new span
    server.idle()
    spans = lane(tmp_path, "server0")
    assert [s["kind"] for s in spans] == ["decode", "pause", "decode", "decode"]
    assert spans[0]["count"] == 5 and spans[0]["running"] == 7 and spans[0]["end"] == pytest.approx(t + 0.05)
    assert spans[1]["version"] == 4 and spans[1]["start"] == pytest.approx(t + 0.06)
    assert not overlapping(spans)
    for span in spans:
        TimelineSpan.model_validate(span)


def test_a_busy_server_writes_a_span_per_decode_span_max_not_per_step(tmp_path: Path) -> None:
    server = ServerTimeline(TimelineWriter(tmp_path, "server", "server1"))
    steps = 2000
    for i in range(steps):  # 10 s of 5 ms steps
        server.step(i * 0.005, (i + 1) * 0.005, running=8)
    server.idle()
    spans = lane(tmp_path, "server1")
    assert len(spans) <= 10 / DECODE_SPAN_MAX_S + 1
    assert sum(s["count"] for s in spans) == steps


def test_a_lane_stops_at_its_cap_with_a_truncated_line_and_a_restart_keeps_counting(tmp_path: Path) -> None:
    writer = TimelineWriter(tmp_path, "trainer", "trainer", max_lines=5)
    for i in range(3):
        writer.span("wait", i, i + 0.5)
    again = TimelineWriter(tmp_path, "trainer", "trainer", max_lines=5)  # a resumed trainer
    for i in range(3, 10):
        again.span("wait", i, i + 0.5)
    spans = lane(tmp_path, "trainer")
    assert len(spans) == 5 and spans[-1]["kind"] == "truncated"


def test_trainer_phases_follow_each_other_and_stale_drops_are_instants(tmp_path: Path) -> None:
    timeline = TrainerTimeline(TimelineWriter(tmp_path, "trainer", "trainer1"))
    start = timeline.mark
    timeline.phase("wait", start + 1)
    timeline.dropped_stale(0)  # nothing dropped: no line
    timeline.dropped_stale(3)
    timeline.phase("forward_backward", start + 2)
    timeline.phase("optimizer", start + 2.5)
    timeline.phase("broadcast", start + 3, version=1)
    spans = lane(tmp_path, "trainer1")
    phases = [s for s in spans if s["kind"] != "drop"]
    assert [s["kind"] for s in phases] == ["wait", "forward_backward", "optimizer", "broadcast"]
    assert all(a["end"] == b["start"] for a, b in zip(phases, phases[1:]))
    drop = next(s for s in spans if s["kind"] == "drop")
    assert drop["reason"] == "stale" and drop["count"] == 3 and drop["start"] == drop["end"]


def test_actor_groups_carry_why_they_wrote_nothing(tmp_path: Path) -> None:
    actor = ActorTimeline(TimelineWriter(tmp_path, "actor", "actor"), deferrable=True)
    for index in range(4):
        actor.launch(index)
    actor.done(0, 8)
    actor.dropped_zero_advantage("g00000001")
    actor.done(1, 0)
    actor.done(2, 0)  # tail batching deferred it
    actor.done(None, 0)  # a sync tail round: no group of its own
    spans = lane(tmp_path, "actor")
    assert [(s["kind"], s.get("reason"), s["count"]) for s in spans] == [
        ("group", None, 8), ("group", "zero_advantage", 0), ("group", "deferred", 0)]
    plain = ActorTimeline(TimelineWriter(tmp_path, "actor", "actor2"), deferrable=False)
    plain.launch(7)
    plain.done(7, 0)
    assert lane(tmp_path, "actor2")[0]["reason"] == "empty"


def test_a_line_being_written_is_left_for_the_next_read(tmp_path: Path) -> None:
    path = timeline_path(tmp_path, "server0")
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "decode", "start": 1, "end": 2}\n{"kind": "pau')
    spans, offset = read_lane(path)
    assert len(spans) == 1 and offset == path.read_text().index("\n") + 1
    with path.open("a") as handle:
        handle.write('se", "start": 2, "end": 3, "version": 1}\n')
    more, end = read_lane(path, offset)
    assert [s["kind"] for s in more] == ["pause"] and end == path.stat().st_size


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_real_runs_timeline_shows_every_weight_update_and_nothing_impossible(tiny_model: Path, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "name": "timeline",
        "model": {"path": str(tiny_model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "inference": {"num_servers": 2},
        "actor": {"group_size": 4, "groups_in_flight": 3, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 4, "checkpoint_every": 2, "lr": 1e-4},
        "eval": {"heldout_every_n_steps": 2, "heldout_k": 1},
    }))
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"],
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {path.stem for path in lane_files(out)} == {"server0", "server1", "trainer", "actor"}
    by_lane: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in lane_files(out):
        for span in read_lane(path)[0]:
            TimelineSpan.model_validate(span)
            assert span["end"] >= span["start"]
            by_lane[span["lane"]].append(span)

    versions = {int(r["weights/version"]) for r in read_metrics(out / "metrics.jsonl") if "weights/version" in r}
    assert versions == {1, 2, 3, 4}
    trainer = by_lane["trainer"]
    assert {s["version"] for s in trainer if s["kind"] == "broadcast"} == versions
    for server in ("server0", "server1"):
        spans = by_lane[server]
        assert sorted(s["version"] for s in spans if s["kind"] == "pause") == sorted(versions), server
        assert any(s["kind"] == "decode" for s in spans)
        # One decode loop: its pauses and its decode spans never overlap one another.
        assert not overlapping(spans), server
    phases = [s for s in trainer if s["kind"] != "drop"]
    assert not overlapping(phases)
    kinds = [s["kind"] for s in phases]
    assert {"wait", "forward_backward", "optimizer", "broadcast", "checkpoint"} <= set(kinds)
    # Each update reaches a server while the trainer broadcasts it (clocks of one machine).
    for version in versions:
        broadcast = next(s for s in trainer if s["kind"] == "broadcast" and s["version"] == version)
        for server in ("server0", "server1"):
            pause = next(s for s in by_lane[server] if s["kind"] == "pause" and s["version"] == version)
            assert broadcast["start"] - 1e-3 <= pause["start"] and pause["end"] <= broadcast["end"] + 1e-3
    groups = [s for s in by_lane["actor"] if s["kind"] == "group"]
    written = sum(s["count"] for s in groups)
    assert written >= 4 * 8 and all(s["count"] == 4 or s.get("reason") for s in groups)
    assert json.loads((out / "status.json").read_text())["state"] == "succeeded"
