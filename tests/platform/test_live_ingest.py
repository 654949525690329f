"""A metrics line's one way through the platform (`inflight.live.ingest`, issue 32 §5): a poll's
lines land as one batch, exactly once and in order, whatever the worker re-sends after a restart;
the push goes out once the batch committed, through the public broadcast functions."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from inflight.live import broadcast
from inflight.live import ingest as live_ingest
from inflight.live.broadcast import batch_points
from inflight.live.ingest import MetricsIngestState
from inflight.runs.models import MetricPoint, Run

pytestmark = pytest.mark.django_db


def make_run(owner: Any) -> Run:
    return Run.objects.create(owner=owner, name="ingested", config={}, status="running")


def lines(first: int, count: int) -> list[tuple[int, dict[str, Any]]]:
    return [(n, {"t": 1_000.0 + n, "step": n, "train/loss": 1.0 / (n + 1), "rollout/reward_mean": n / 10}) for n in range(first, first + count)]


@pytest.fixture
def pushes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """The pushes handed to the broadcast queue (as the sender would queue them)."""
    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(broadcast, "push", lambda group, message: sent.append((group, message)))
    return sent


def stored(run: Run) -> list[tuple[int, str, int, float]]:
    return list(MetricPoint.objects.filter(run=run).order_by("seq", "line", "name").values_list("line", "name", "step", "value"))


def test_a_polls_lines_are_one_batch_stored_once_in_order_and_pushed_after_commit(
    owner: Any, pushes: list[tuple[str, dict[str, Any]]], django_capture_on_commit_callbacks: Any
) -> None:
    run = make_run(owner)
    state = MetricsIngestState()
    with django_capture_on_commit_callbacks(execute=True):
        assert live_ingest.ingest_metric_lines(run.pk, lines(0, 5), state) == 1
        assert live_ingest.ingest_metric_lines(run.pk, lines(5, 3), state) == 2  # one statement while the state holds
    assert [line for line, *_ in stored(run)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert list(MetricPoint.objects.filter(run=run).values_list("seq", flat=True).distinct().order_by("seq")) == [1, 2]
    assert [(group, message["seq"], len(batch_points(message))) for group, message in pushes] == [(f"run-{run.pk}", 1, 10), (f"run-{run.pk}", 2, 6)]
    # In the line order the run wrote them, each point as [name, step, t, value].
    assert batch_points(pushes[1][1])[:2] == [["train/loss", 5, 1_005.0, 1.0 / 6], ["rollout/reward_mean", 5, 1_005.0, 0.5]]
    # The points travel as JSON text, made once here: the web node passes it on to every open page
    # without decoding and encoding each point again.
    assert all(isinstance(message["points_json"], str) and "points" not in message for _, message in pushes)


def test_a_restarted_worker_resending_a_half_stored_poll_loses_and_doubles_nothing(
    owner: Any, pushes: list[tuple[str, dict[str, Any]]], django_capture_on_commit_callbacks: Any
) -> None:
    """The worker died after lines 0-5 were stored: its successor tails metrics.jsonl from the top
    with a fresh state and sends 0-9 in one poll. Only 6-9 are new: stored once, pushed once."""
    run = make_run(owner)
    with django_capture_on_commit_callbacks(execute=True):
        live_ingest.ingest_metric_lines(run.pk, lines(0, 6), MetricsIngestState())
        restarted = MetricsIngestState()
        assert live_ingest.ingest_metric_lines(run.pk, lines(0, 10), restarted) == 2
        assert live_ingest.ingest_metric_lines(run.pk, lines(0, 10), restarted) is None  # and again: nothing
        assert live_ingest.ingest_metric_lines(run.pk, lines(10, 1), restarted) == 3  # the state settled: on it goes
    rows = stored(run)
    assert [line for line, *_ in rows] == sorted(n for n in range(11) for _ in range(2))
    assert len(rows) == len(set((line, name) for line, name, *_ in rows))
    assert [(message["seq"], sorted({point[1] for point in batch_points(message)})) for _, message in pushes] == [
        (1, [0, 1, 2, 3, 4, 5]), (2, [6, 7, 8, 9]), (3, [10])
    ]
    assert Run.objects.get(pk=run.pk).metrics_seq == 3


def test_an_unreadable_line_is_named_and_the_rest_of_the_poll_stored(owner: Any) -> None:
    run = make_run(owner)
    skipped: list[tuple[int, str]] = []
    records = lines(0, 3)
    records[1] = (1, {"t": 1.0, "step": "not a step", "train/loss": 0.5})
    records.append((3, {"t": float("nan"), "step": 3, "train/loss": 0.25}))  # no finite time: dropped, as before
    records.append((4, {"t": 5.0, "step": 4, "flag": True, "note": "x", "n": 2}))  # numbers only
    assert live_ingest.ingest_metric_lines(run.pk, records, MetricsIngestState(), skipped) == 1
    assert [(line, name) for line, name, *_ in stored(run)] == [
        (0, "rollout/reward_mean"), (0, "train/loss"), (2, "rollout/reward_mean"), (2, "train/loss"), (4, "n")
    ]
    assert [line for line, _ in skipped] == [1]


def test_the_lines_columns_equal_the_points_split_one_by_one() -> None:
    """`PointColumns.of_records` (the worker's path, no object per value) and
    `points_from_metrics_record` (the benches' and tests') give the same batch."""
    records = lines(0, 4) + [(4, {"t": 9.0, "step": 4, "x" * 200: 1.5, "a": 2})]
    by_points = live_ingest.PointColumns.of_points(p for line, record in records for p in live_ingest.points_from_metrics_record(line, record))
    assert live_ingest.PointColumns.of_records(records) == by_points
    assert max(len(name) for name in by_points.names) == MetricPoint._meta.get_field("name").max_length


def test_a_push_on_commit_waits_for_the_commit_and_is_dropped_with_a_rollback(
    pushes: list[tuple[str, dict[str, Any]]], django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            broadcast.push_on_commit("run-1", {"type": "run.panel", "run_id": 1})
            assert pushes == []
    assert pushes == [("run-1", {"type": "run.panel", "run_id": 1})]
    with django_capture_on_commit_callbacks(execute=True):
        try:
            with transaction.atomic():
                broadcast.push_on_commit("run-1", {"type": "run.panel", "run_id": 1})
                raise RuntimeError("rolled back")
        except RuntimeError:
            pass
    assert len(pushes) == 1


def test_an_evaluation_is_one_statement_and_a_resend_updates_its_score_without_doubling_rows(owner: Any) -> None:
    """`runs.evaluations.ingest_eval`: the score upserted and its per-problem rows inserted in one
    statement (it was six round trips, a third of ingest at 200 live runs); sent again (a worker
    restarted mid-delivery) it updates the score and adds no row."""
    import psycopg

    from inflight.runs.evaluations import ingest_eval
    from inflight.runs.models import EvalProblemResult, EvalScore

    run = make_run(owner)
    line = {"t": 5.0, "step": 10, "benchmark": "heldout", "k": 4, "mean_at_k": 0.5, "pass_at_k": 0.75, "stderr": None,
            "num_problems": 2, "num_samples": 8, "policy_versions": [9, 10], "results_file": "eval/step_000010_heldout.jsonl"}
    rows = [{"problem_id": f"p{i}", "problem": f"Compute {i} + 1.", "answer": str(i + 1), "samples": ["a", "b"], "extracted": ["1", None],
             "verdicts": [True, False], "mean": 0.5, "pass": True} for i in range(2)]
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else str(query)
        if not text.lstrip().upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            sent.append(text)
        return execute(self, query, *args, **kwargs)

    psycopg.Cursor.execute = counting  # type: ignore[method-assign]
    try:
        score = ingest_eval(run.pk, line, rows)
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    assert len(sent) == 1, sent
    stored = EvalScore.objects.get(run=run)
    assert score.pk == stored.pk and (stored.mean_at_k, stored.policy_versions, stored.stderr) == (0.5, [9, 10], None)
    assert list(EvalProblemResult.objects.filter(eval=stored).order_by("problem_id").values_list("problem_id", "extracted", "passed")) == [
        ("p0", ["1", None], True), ("p1", ["1", None], True)
    ]
    again = ingest_eval(run.pk, {**line, "mean_at_k": 0.625}, rows + [{**rows[0], "problem_id": "p2"}])
    assert again.pk == stored.pk and EvalScore.objects.get(run=run).mean_at_k == 0.625
    assert EvalProblemResult.objects.filter(eval=stored).count() == 3  # only the new problem added


@pytest.mark.django_db(transaction=True)
def test_the_writer_stores_the_batches_of_many_runs_in_one_statement(owner: Any, monkeypatch: pytest.MonkeyPatch,
                                                                      pushes: list[tuple[str, dict[str, Any]]]) -> None:
    """Supervisors hand their runs' lines to the process's writer and go on; it writes every batch
    waiting in one statement. Each still gets its run's seq and push, and a run whose kept state no
    longer holds is stored the transactional way when its result is asked for, losing nothing."""
    runs = [make_run(owner) for _ in range(6)]
    states = {run.pk: MetricsIngestState() for run in runs}
    for run in runs:  # a run's first batch settles its state the transactional way
        assert live_ingest.ingest_metric_lines(run.pk, lines(0, 1), states[run.pk]) == 1
    states[runs[-1].pk].seq = 7  # stale (as if another process had written meanwhile): its guard fails
    written: list[list[int]] = []
    write = live_ingest._write_guarded
    monkeypatch.setattr(live_ingest, "_write_guarded", lambda batches: written.append([p.run_id for p in batches]) or write(batches))
    with live_ingest._writer._lock:  # the writer takes nothing until all six are queued
        pending = [live_ingest.submit_metric_lines(run.pk, lines(1, 2), states[run.pk]) for run in runs]
        assert not any(p.ready() for p in pending)
    assert [p.result() for p in pending] == [2] * 6
    assert written == [[run.pk for run in runs]]
    for run in runs:
        assert [line for line, *_ in stored(run)] == [0, 0, 1, 1, 2, 2]
        assert Run.objects.get(pk=run.pk).metrics_seq == 2 and states[run.pk].seq == 2
    assert sorted((group, message["seq"]) for group, message in pushes if message["seq"] == 2) == sorted((f"run-{run.pk}", 2) for run in runs)


@pytest.mark.django_db(transaction=True)
def test_a_failed_write_is_every_batchs_error_and_the_lines_sent_again_are_stored_once(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    runs = [make_run(owner) for _ in range(3)]
    states = {run.pk: MetricsIngestState() for run in runs}
    for run in runs:
        live_ingest.ingest_metric_lines(run.pk, lines(0, 1), states[run.pk])
    write = live_ingest._write_guarded
    failures = [OperationalError("server closed the connection unexpectedly")]

    def flaky(batches: list[Any]) -> None:
        if failures:
            raise failures.pop()
        write(batches)

    monkeypatch.setattr(live_ingest, "_write_guarded", flaky)
    with live_ingest._writer._lock:
        pending = [live_ingest.submit_metric_lines(run.pk, lines(1, 2), states[run.pk]) for run in runs]
    for p in pending:
        with pytest.raises(OperationalError):
            p.result()
    # The supervisors read the same lines again on their next poll.
    assert [live_ingest.submit_metric_lines(run.pk, lines(1, 2), states[run.pk]).result() for run in runs] == [2, 2, 2]
    for run in runs:
        assert [line for line, *_ in stored(run)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.django_db(transaction=True)
def test_the_writer_says_its_metrics_are_behind_for_a_while_after_a_late_statement(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that may lag (the rollout viewer's rows) wait while `metrics_behind()`: for
    BEHIND_FOR_S after a statement whose oldest batch took longer than BEHIND_S from hand-over to
    commit, not after one on time."""
    import time

    writer = live_ingest._writer
    monkeypatch.setattr(writer, "BEHIND_FOR_S", 1.0)
    monkeypatch.setattr(writer, "BEHIND_S", 0.5)  # well above a statement's time on a loaded test machine
    monkeypatch.setattr(writer, "_behind_at", float("-inf"))
    run = make_run(owner)
    state = MetricsIngestState()
    live_ingest.ingest_metric_lines(run.pk, lines(0, 1), state)
    write = live_ingest._write_guarded
    slow = [True]

    def slow_then_fast(batches: list[Any]) -> None:
        if slow and slow.pop():
            time.sleep(writer.BEHIND_S + 0.1)  # the database was slow
        write(batches)

    monkeypatch.setattr(live_ingest, "_write_guarded", slow_then_fast)
    assert not live_ingest.metrics_behind()
    assert live_ingest.submit_metric_lines(run.pk, lines(1, 1), state).result() == 2
    assert live_ingest.metrics_behind()
    time.sleep(1.1)
    assert not live_ingest.metrics_behind()
    assert live_ingest.submit_metric_lines(run.pk, lines(2, 1), state).result() == 3
    assert not live_ingest.metrics_behind()
