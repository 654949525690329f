"""Run services against the real embedded PostgreSQL: state machine, idempotent ingest, evals, liveness."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.utils import timezone

from inflight.runs import evaluations, selectors, services
from inflight.runs.models import ALLOWED_TRANSITIONS, EvalProblemResult, EvalScore, MetricPoint, Run, RunStatus, Worker
from inflight.runs.services import IllegalTransition, InvalidRunConfig
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


def make_run(owner, **config) -> Run:
    return services.create_run(owner, "r", {"name": "r", **config})


def test_create_run_validates_and_derives_the_queue(owner, tiny_config, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = services.create_run(owner, "my run", tiny_config)
    assert run.status == RunStatus.QUEUED and run.queue == "cpu" and run.name == "my run"
    assert run.config["trainer"]["max_steps"] == 2 and run.config["name"] == "my run"
    assert len(callbacks) == 2  # dispatch + status broadcast, only after commit
    gpu = services.create_run(owner, "g", {"trainer": {"device": "cuda"}})
    assert gpu.queue == "gpu"


def test_create_run_refuses_bad_config_with_field_errors(owner) -> None:
    with pytest.raises(InvalidRunConfig) as info:
        services.create_run(owner, "bad", {"trainer": {"max_steps": 0, "typo": 1}, "bogus": {}})
    errors = info.value.errors
    assert "trainer.max_steps" in errors and "trainer.typo" in errors and "bogus" in errors
    assert Run.objects.count() == 0
    with pytest.raises(InvalidRunConfig):
        services.create_run(owner, "bad", ["not", "a", "mapping"])


def test_state_machine_allows_the_documented_path_and_refuses_the_rest(owner) -> None:
    run = make_run(owner)
    assert services.claim_run(run.pk, "w@host").status == RunStatus.STARTING
    assert services.claim_run(run.pk, "w@host") is None  # a redelivered message does not run it twice
    run = services.transition_run(run.pk, RunStatus.RUNNING)
    assert run.started_at is not None and run.finished_at is None and run.worker_name == "w@host"
    run = services.transition_run(run.pk, RunStatus.SUCCEEDED)
    assert run.finished_at is not None
    for target in RunStatus.values:
        with pytest.raises(IllegalTransition):
            services.transition_run(run.pk, target)
    with pytest.raises(IllegalTransition):
        services.transition_run(make_run(owner).pk, RunStatus.RUNNING)  # queued → running skips starting
    with pytest.raises(IllegalTransition):
        services.transition_run(make_run(owner).pk, "exploded")


def test_every_status_has_a_rule_and_terminal_ones_are_final() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(RunStatus.values)
    # An ended run only goes back to `queued` when its owner resumes it (runs.actions.resume_run);
    # a succeeded one is final.
    assert ALLOWED_TRANSITIONS["succeeded"] == frozenset()
    for status in ("failed", "cancelled"):
        assert ALLOWED_TRANSITIONS[status] == frozenset({"queued"})
    # `lost` is a presumption: the run directory (read by the restarted worker) or a cancel settles it.
    assert ALLOWED_TRANSITIONS["lost"] == frozenset({"succeeded", "failed", "cancelled", "queued"})


def test_cancel_queued_is_immediate_running_goes_through_cancelling(owner, other_user, staff_user) -> None:
    queued = make_run(owner)
    with pytest.raises(PermissionDenied):
        services.request_cancel(queued, other_user)
    assert services.request_cancel(queued, owner).status == RunStatus.CANCELLED
    with pytest.raises(IllegalTransition):
        services.request_cancel(Run.objects.get(pk=queued.pk), owner)
    running = make_run(owner)
    services.claim_run(running.pk, "w@host")
    services.transition_run(running.pk, RunStatus.RUNNING)
    cancelling = services.request_cancel(running, staff_user)
    assert cancelling.status == RunStatus.CANCELLING
    assert Run.objects.get(pk=running.pk).cancel_requested_at is not None
    assert services.request_cancel(cancelling, owner).status == RunStatus.CANCELLING  # idempotent
    assert services.finish_run(running.pk, "cancelled").status == RunStatus.CANCELLED


def test_finish_keeps_a_lost_run_lost(owner) -> None:
    run = make_run(owner)
    services.claim_run(run.pk, "w@host")
    services.transition_run(run.pk, RunStatus.LOST, error="worker vanished")
    assert services.finish_run(run.pk, "succeeded").status == RunStatus.LOST


def test_finish_refused_by_the_state_machine_keeps_the_status(owner) -> None:
    run = make_run(owner)  # still queued: queued → succeeded is not a transition
    assert services.finish_run(run.pk, "succeeded").status == RunStatus.QUEUED


def _points(lines: range, names=("loss", "reward")) -> list[PointIn]:
    return [PointIn(line=i, name=n, step=i, t=1000.0 + i, value=float(i)) for i in lines for n in names]


def test_ingest_is_idempotent_and_bumps_seq_only_for_new_points(owner) -> None:
    run = make_run(owner)
    assert live_ingest.ingest_metrics(run.pk, _points(range(0, 10))) == 1
    assert live_ingest.ingest_metrics(run.pk, _points(range(0, 10))) is None  # same batch again
    assert MetricPoint.objects.filter(run=run).count() == 20
    assert live_ingest.ingest_metrics(run.pk, _points(range(5, 15))) == 2  # overlapping batch
    assert MetricPoint.objects.filter(run=run).count() == 30
    assert Run.objects.get(pk=run.pk).metrics_seq == 2
    seq, points, truncated = selectors.metric_points_page(run, since_seq=1)
    assert seq == 2 and not truncated and len(points) == 10 and {p[1] for p in points} == set(range(10, 15))
    loss = MetricPoint.objects.filter(run=run, name="loss").order_by("step", "line").values_list("step", "value")
    assert list(loss) == [(i, float(i)) for i in range(15)]
    nan = [PointIn(line=99, name="loss", step=99, t=1.0, value=float("nan"))]
    assert live_ingest.ingest_metrics(run.pk, nan) is None
    with pytest.raises(Run.DoesNotExist):
        live_ingest.ingest_metrics(10**9, _points(range(1)))


def test_points_from_metrics_record_keeps_numbers_only() -> None:
    points = live_ingest.points_from_metrics_record(7, {"t": 5.0, "step": 3, "a": 1, "b": 2.5, "flag": True, "s": "x"})
    assert [(p.line, p.name, p.step, p.t, p.value) for p in points] == [(7, "a", 3, 5.0, 1.0), (7, "b", 3, 5.0, 2.5)]


EVAL_LINE = {
    "t": 1.0, "step": 4, "benchmark": "math500", "k": 2, "mean_at_k": 0.25, "pass_at_k": 0.5, "stderr": 0.1,
    "num_problems": 2, "num_samples": 4, "policy_versions": [4], "results_file": "eval/step_000004_math500.jsonl",
}
ROWS = [
    {"problem_id": "p1", "answer": "2", "samples": ["\\boxed{2}", "x"], "extracted": ["2", None], "verdicts": [True, False], "mean": 0.5, "pass": True},
    {"problem_id": "p2", "answer": "3", "samples": ["a", "b"], "extracted": [None, None], "verdicts": [False, False], "mean": 0.0, "pass": False},
]


def test_ingest_eval_stores_per_problem_rows_once(owner) -> None:
    run = make_run(owner)
    score = evaluations.ingest_eval(run.pk, EVAL_LINE, ROWS)
    again = evaluations.ingest_eval(run.pk, EVAL_LINE, ROWS)
    assert score.pk == again.pk and EvalScore.objects.count() == 1
    assert EvalProblemResult.objects.filter(eval=score).count() == 2
    first = selectors.eval_problem_results(score).first()
    assert first.problem_id == "p1" and first.verdicts == [True, False] and first.passed
    stored = {row.problem_id: (row.answer, row.samples, row.extracted, row.verdicts, row.mean, row.passed) for row in EvalProblemResult.objects.filter(eval=score)}
    assert stored == {row["problem_id"]: (row.get("answer", ""), row["samples"], row["extracted"], row["verdicts"], row["mean"], row["pass"]) for row in ROWS}
    with pytest.raises(ValueError, match="benchmark"):
        evaluations.ingest_eval(run.pk, {"step": 1}, [])


def test_an_evaluation_row_json_cannot_carry_is_stored_value_by_value(owner) -> None:
    """A per-problem `mean` of NaN has no JSON form: those rows go to PostgreSQL bound one value at
    a time (runs.json_rows), and a re-sent line still adds nothing."""
    run = make_run(owner)
    rows = [{**ROWS[0], "mean": float("nan")}, ROWS[1]]
    score = evaluations.ingest_eval(run.pk, EVAL_LINE, rows)
    evaluations.ingest_eval(run.pk, EVAL_LINE, rows)
    stored = {row.problem_id: row for row in EvalProblemResult.objects.filter(eval=score)}
    assert sorted(stored) == ["p1", "p2"]
    assert stored["p1"].mean != stored["p1"].mean and stored["p1"].samples == ROWS[0]["samples"]  # NaN kept
    assert stored["p2"].mean == 0.0 and stored["p2"].extracted == [None, None]


def test_leaderboard_uses_one_rule_for_best_and_last(owner, other_user, staff_user) -> None:
    a = make_run(owner)
    b = make_run(owner)
    hidden = make_run(other_user)
    for run, scores in ((a, [(1, 0.2), (2, 0.6), (3, 0.4)]), (b, [(1, 0.5)]), (hidden, [(1, 0.9)])):
        for step, mean in scores:
            evaluations.ingest_eval(run.pk, {**EVAL_LINE, "benchmark": "aime24", "step": step, "mean_at_k": mean}, [])
    live_ingest.ingest_metrics(a.pk, [PointIn(i, "success/mean", i, 1.0, v) for i, v in enumerate([0.1, 0.7, 0.3])])
    rows = selectors.leaderboard(owner, "-aime24_best")[0]
    assert [r["run_id"] for r in rows] == [a.pk, b.pk]
    assert rows[0]["aime24_best"] == 0.6 and rows[0]["aime24_last"] == 0.4
    assert rows[0]["success_best"] == 0.7 and rows[0]["success_last"] == 0.3
    assert rows[1]["math500_best"] is None
    assert [r["run_id"] for r in selectors.leaderboard(owner, "aime24_last")[0]] == [a.pk, b.pk]
    assert [r["run_id"] for r in selectors.leaderboard(owner, "-aime24_last")[0]] == [b.pk, a.pk]
    assert len(selectors.leaderboard(staff_user)[0]) == 3
    with pytest.raises(ValueError, match="unknown sort key"):
        selectors.leaderboard(owner, "password")


def test_runs_of_silent_workers_become_lost(owner) -> None:
    now = timezone.now()
    services.record_heartbeat("alive@h", hostname="h", queues=["cpu"], gpus=[], cpu_count=2)
    services.record_heartbeat("dead@h", hostname="h", queues=["cpu"], gpus=[], cpu_count=2)
    Worker.objects.filter(name="dead@h").update(last_heartbeat=now - timedelta(seconds=600))
    on_alive, on_dead, queued = make_run(owner), make_run(owner), make_run(owner)
    services.claim_run(on_alive.pk, "alive@h")
    services.claim_run(on_dead.pk, "dead@h")
    assert services.mark_lost_runs(lost_after_s=30) == [on_dead.pk]
    lost = Run.objects.get(pk=on_dead.pk)
    assert lost.status == RunStatus.LOST and "dead@h" in lost.error
    assert Run.objects.get(pk=on_alive.pk).status == RunStatus.STARTING
    assert Run.objects.get(pk=queued.pk).status == RunStatus.QUEUED
    # A worker never seen yet (claimed before its first heartbeat) gets the same grace period.
    fresh, stale = make_run(owner), make_run(owner)
    services.claim_run(fresh.pk, "new@h")
    services.claim_run(stale.pk, "gone@h")
    Run.objects.filter(pk=stale.pk).update(started_at=now - timedelta(seconds=600))
    assert services.mark_lost_runs(lost_after_s=30) == [stale.pk]
    assert Run.objects.get(pk=fresh.pk).status == RunStatus.STARTING
    liveness = {w["name"]: w["alive"] for w in selectors.workers_with_liveness()}
    assert liveness == {"alive@h": True, "dead@h": False}


def test_visibility_owner_other_staff(owner, other_user, staff_user, django_user_model) -> None:
    from django.contrib.auth.models import AnonymousUser

    run = make_run(owner)
    assert selectors.visible_run_or_404(owner, run.pk) == run
    assert selectors.visible_run_or_404(staff_user, run.pk) == run
    with pytest.raises(Http404):
        selectors.visible_run_or_404(other_user, run.pk)
    with pytest.raises(Http404):  # past a bigint: not a run, and never sent to the database
        selectors.visible_run_or_404(owner, 2**63)
    assert not selectors.runs_visible_to(AnonymousUser()).exists()


def test_a_nul_character_a_model_sampled_is_stored_as_the_replacement_character(owner) -> None:
    """PostgreSQL refuses U+0000 in text and jsonb; the evaluation was retried for ever and held up
    the run's delivery. Both insert paths (one JSON document; value by value when a NaN has no JSON
    form) store it as U+FFFD, and a literal backslash-u-0000 a model wrote is kept as written."""
    run = make_run(owner)
    sampled = "\\boxed{2}\x00 and a literal \\u0000"
    rows = [{**ROWS[0], "samples": [sampled, "x"], "extracted": ["2\x00", None]}, ROWS[1]]
    score = evaluations.ingest_eval(run.pk, EVAL_LINE, rows)
    stored = EvalProblemResult.objects.get(eval=score, problem_id="p1")
    assert stored.samples == ["\\boxed{2}\ufffd and a literal \\u0000", "x"] and stored.extracted == ["2\ufffd", None]
    nan_rows = [{**rows[0], "mean": float("nan")}, ROWS[1]]
    score = evaluations.ingest_eval(run.pk, {**EVAL_LINE, "step": 5}, nan_rows)
    assert EvalProblemResult.objects.get(eval=score, problem_id="p1").samples[0] == "\\boxed{2}\ufffd and a literal \\u0000"


@pytest.mark.django_db(transaction=True)
def test_the_worker_stores_evaluations_on_their_writer_thread_and_skips_a_malformed_one(owner, tmp_path: Path, hold_writes: Any) -> None:
    """Outside a transaction (a worker) an evaluation goes to the process's evaluation writer: the
    supervisor goes on at once (at 200 live runs storing them itself held back the metrics of every
    run it polls); a line the writer refuses for good (a field missing) is skipped, not retried."""
    from rl_core.rundir.layout import EVALS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "step_000002_heldout.jsonl").write_text(json.dumps(
        {"problem_id": "p1", "problem": "1+1", "answer": "2", "samples": ["2"], "extracted": ["2"], "verdicts": [True], "mean": 1.0, "pass": True}) + "\n")
    score = {"t": 1.0, "step": 2, "benchmark": "heldout", "k": 1, "mean_at_k": 1.0, "pass_at_k": 1.0, "num_problems": 1,
             "num_samples": 1, "results_file": "eval/step_000002_heldout.jsonl"}
    malformed = {key: value for key, value in score.items() if key != "k"} | {"step": 3}
    (tmp_path / EVALS_FILE).write_text(json.dumps(malformed) + "\n" + json.dumps(score) + "\n")
    released = hold_writes(evaluations, "ingest_eval")
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    assert supervisor.deliver() is False  # handed over, not stored yet
    assert supervisor.evals_tail.line_no == 0
    released.set()
    deadline = time.monotonic() + 20
    while not supervisor.deliver() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert supervisor.evals_tail.line_no == 2  # the malformed line passed, the good one stored
    assert list(EvalScore.objects.filter(run=run).values_list("step", flat=True)) == [2]
    assert EvalProblemResult.objects.filter(eval__run=run).count() == 1


@pytest.mark.django_db(transaction=True)  # a sweep closes its connection around each tick, as in a worker
def test_a_sweep_whose_round_trip_waited_gives_the_others_a_fresh_threshold_before_judging(settings) -> None:
    """A pooled connection is waited for during a short outage, not refused: a sweep that never saw
    an error but waited longer than a heartbeat interval must not judge the other workers by
    heartbeats that waited too (tests/platform/test_faults.py, the outage longer than the threshold)."""
    from inflight.runs.liveness import LostRunSweeper

    settings.INFLIGHT_HEARTBEAT_INTERVAL_S = 0.05
    slow = {"s": 0.0}
    sweeper = LostRunSweeper("test", lost_after_s=0.2, before_sweep=lambda: time.sleep(slow["s"]))
    sweeper.tick()
    time.sleep(0.25)
    assert sweeper.may_judge()  # reachable for the whole threshold
    slow["s"] = 0.1  # the round trip waited (for a connection) longer than a heartbeat interval
    sweeper.tick()
    assert not sweeper.may_judge()
    slow["s"] = 0.0
    time.sleep(0.25)
    sweeper.tick()
    assert sweeper.may_judge()
