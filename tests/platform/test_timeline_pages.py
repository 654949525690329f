"""The run page's Timeline (`runs/<id>/timeline.json`) and the lag prediction's endpoints
(`runs/new/lag.json` for the create page, `runs/<id>/lag.json` for the run page)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.runs import run_paths
from rl_core.rundir.timeline import ServerTimeline, TimelineWriter, TrainerTimeline
from tests.platform.test_first_hour_browser import curve, make_run

pytestmark = pytest.mark.django_db


def record_spans(run_dir: Path, updates: int = 3, t0: float = 1_800_000_000.0) -> None:
    """Spans as a run's roles write them: a trainer step then every server's pause, per update."""
    trainer = TrainerTimeline(TimelineWriter(run_dir, "trainer", "trainer"))
    trainer.mark = t0
    servers = [ServerTimeline(TimelineWriter(run_dir, "server", f"server{i}")) for i in range(2)]
    t = t0
    for version in range(1, updates + 1):
        for server in servers:
            for step in range(10):
                server.step(t + 0.01 * step, t + 0.01 * (step + 1), running=16)
        trainer.phase("wait", t + 0.2)
        trainer.phase("forward_backward", t + 0.5)
        trainer.phase("optimizer", t + 0.6)
        for server in servers:
            server.pause(t + 0.62, t + 0.64, version)
        trainer.phase("broadcast", t + 0.66, version=version)
        t += 0.7


def test_the_timeline_answers_each_lane_once_then_only_what_is_new(owner, owner_web) -> None:
    run = make_run(owner, "timeline", status="running")
    run_dir = run_paths.run_dir(run.pk)
    record_spans(run_dir, updates=2)
    first = owner_web.get(f"/runs/{run.pk}/timeline.json").json()
    assert [lane["lane"] for lane in first["lanes"]] == ["server0", "server1", "trainer"]  # servers, then ranks
    assert first["live"] is True and first["more"] is False
    pauses = [s for s in first["spans"] if s["kind"] == "pause"]
    assert sorted((s["lane"], s["version"]) for s in pauses) == [("server0", 1), ("server0", 2), ("server1", 1), ("server1", 2)]
    offsets = ",".join(f"{lane}:{offset}" for lane, offset in first["offsets"].items())
    assert owner_web.get(f"/runs/{run.pk}/timeline.json", {"offsets": offsets}).json()["spans"] == []
    TrainerTimeline(TimelineWriter(run_dir, "trainer", "trainer")).phase("wait")
    again = owner_web.get(f"/runs/{run.pk}/timeline.json", {"offsets": offsets}).json()
    assert [s["kind"] for s in again["spans"]] == ["wait"]


def test_a_cluster_runs_lanes_say_their_node(owner, owner_web) -> None:
    from rl_core.rundir.layout import CLUSTER_FILE

    run = make_run(owner, "cluster-timeline", status="succeeded")
    run_dir = run_paths.run_dir(run.pk)
    record_spans(run_dir, updates=1)
    (run_dir / CLUSTER_FILE).write_text('{"placement_wait_s": 1.0, "roles": [{"role": "server0", "node": 0, "address": "10.0.0.1"}, '
                                        '{"role": "server1", "node": 1, "address": "10.0.0.2"}, {"role": "trainer", "node": 0, "address": "10.0.0.1"}]}')
    answer = owner_web.get(f"/runs/{run.pk}/timeline.json").json()
    assert {lane["lane"]: lane["node"] for lane in answer["lanes"]} == {"server0": 0, "server1": 1, "trainer": 0}
    assert answer["live"] is False


def test_the_timeline_is_the_owners_and_refuses_bad_offsets(owner, other_web, owner_web) -> None:
    run = make_run(owner, "private-timeline", status="running")
    record_spans(run_paths.run_dir(run.pk), updates=1)
    assert other_web.get(f"/runs/{run.pk}/timeline.json").status_code == 404
    bad = owner_web.get(f"/runs/{run.pk}/timeline.json", {"offsets": "../etc:0"})
    assert bad.status_code == 400 and "offsets" in bad.json()["error"]
    empty = make_run(owner, "no-timeline", status="running")
    assert owner_web.get(f"/runs/{empty.pk}/timeline.json").json()["spans"] == []


def test_the_create_page_prediction_follows_the_form_and_names_a_bad_field(owner_web) -> None:
    from rl_core.actor.lag_prediction import predict_lag
    from rl_core.config.files import load_config

    demo = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
    answer = owner_web.post("/runs/new/lag.json", {"mode": "yaml", "config_yaml": demo.read_text()})
    assert answer.status_code == 200, answer.content
    assert answer.json()["prediction"] == predict_lag(load_config(demo)).model_dump()
    wider = owner_web.post("/runs/new/lag.json", {"mode": "yaml", "config_yaml": demo.read_text() + "\n",
                                                  "assume.train_per_token_s": "0.003"}).json()["prediction"]
    assert wider["mean"] > answer.json()["prediction"]["mean"]  # a slower trainer: generation runs further ahead
    refused = owner_web.post("/runs/new/lag.json", {"mode": "yaml", "config_yaml": "actor:\n  max_lag: -1\n"})
    assert refused.status_code == 400 and "actor.max_lag" in refused.json()["error"]
    refused = owner_web.post("/runs/new/lag.json", {"mode": "yaml", "config_yaml": "", "assume.decode_base_s": "-2"})
    assert refused.status_code == 400 and "assume.decode_base_s" in refused.json()["error"]


def test_the_run_page_compares_the_prediction_with_the_measured_lag(owner, owner_web, other_web) -> None:
    run = make_run(owner, "lag", records=curve(
        4, policy_lag__mean=lambda step: 1.0 if step > 1 else 0.0, policy_lag__share__0=lambda step: 0.0 if step > 1 else 1.0,
        policy_lag__share__1=lambda step: 1.0 if step > 1 else 0.0, train__dropped_stale=lambda step: 0.0,
        train__samples_consumed=lambda step: 64.0 * step))
    answer = owner_web.get(f"/runs/{run.pk}/lag.json").json()
    assert answer["measured"]["steps"] == 4 and answer["measured"]["mean"] == pytest.approx(0.75)
    assert answer["measured"]["shares"][:2] == pytest.approx([0.25, 0.75]) and answer["measured"]["dropped_stale_share"] == 0
    assert answer["prediction"]["max_lag"] == 2 and sum(answer["prediction"]["shares"]) == pytest.approx(1.0)
    assert owner_web.get(f"/runs/{make_run(owner, 'fresh', status='running').pk}/lag.json").json()["measured"] is None
    assert other_web.get(f"/runs/{run.pk}/lag.json").status_code == 404
