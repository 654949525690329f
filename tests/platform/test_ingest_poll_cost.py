"""What one supervisor poll costs the database (issue 24: 200 live runs on one 2-core machine).

At the demo's rate a run writes about one metrics line a second and a rollout group twice a
second, so ingest pays per written line, not per poll: every statement a line costs is paid
200 times a second. These tests bound the statements of the worker's real path
(`RunSupervisor.deliver()` with `PlatformReporter`) — a metrics line that fires no alert is
stored and folded and nothing else, a rollout batch the store does not keep and an empty poll
touch no table — and check that keeping the alert and rollout state in the supervisor changes
no outcome: alerts fire once per episode across a worker restart, and a database error leaves
the state as it was (the batch is re-sent). Statements are counted at psycopg (ingest_metrics
bypasses Django's cursors), not timed; the time is bench/platform_scale.py's."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest
from django.db import OperationalError

from inflight.alerts import services as alerts
from inflight.alerts.models import Alert, AlertCursor
from inflight.rollouts.models import RolloutStore, StoredRollout
from inflight.rollouts.services import RolloutIngestState, ingest_rollouts
from inflight.rollouts.tokens import decoder_for_model
from inflight.runs.models import MetricPoint, Run
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db

DECODER = decoder_for_model("var/models/tiny")


@contextlib.contextmanager
def statements() -> Iterator[list[str]]:
    """SQL statements sent through psycopg meanwhile (savepoints left out: they are the test
    transaction's nesting, which a worker outside a test does not have)."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = query if isinstance(query, str) else getattr(query, "as_string", lambda _: str(query))(None)
        if not text.lstrip().upper().startswith(("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")):
            sent.append(text)
        return execute(self, query, *args, **kwargs)

    psycopg.Cursor.execute = counting  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]


def make_run(owner: Any, **alert_settings: Any) -> Run:
    config = {
        "trainer": {"samples_per_step": 4},
        "model": {"path": "var/models/tiny"},
        "actor": {"max_lag": 2},
        "monitoring": {"rollouts": {"keep_every_n_steps": 5}, "alerts": alert_settings},
    }
    return Run.objects.create(owner=owner, name="polled", config=config, status="running")


def rollout(line: int) -> dict[str, Any]:
    return {
        "sample_id": f"s{line}", "group_id": f"g{line // 2}", "prompt_id": "p", "prompt_token_ids": [40, 41],
        "completion_token_ids": [50, 51, 52], "behaviour_logprobs": [-0.5] * 3, "token_versions": [0] * 3,
        "reward": 1.0, "success": True, "advantage": 0.5, "finish_reason": "stop", "metadata": {},
    }


def append(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write("".join(json.dumps(record) + "\n" for record in records))


def test_a_poll_costs_the_database_only_what_its_lines_need(owner: Any, tmp_path: Path) -> None:
    from rl_core.rundir.layout import METRICS_FILE, ROLLOUTS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner)
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    metrics, stream = tmp_path / METRICS_FILE, tmp_path / ROLLOUTS_FILE
    # The first poll reads what the supervisor keeps (config, alert cursor, rollout store).
    append(metrics, [{"t": 1.0, "step": 0, "train/loss": 1.0, "train/reward_mean": 0.5}])
    append(stream, [rollout(line) for line in range(4)])  # step 1
    assert supervisor.deliver() is True

    # A quiet metrics line: stored, folded and its seq taken in one statement, nothing else.
    append(metrics, [{"t": 2.0, "step": 1, "train/loss": 0.9, "train/reward_mean": 0.5}])
    with statements() as sent:
        assert supervisor.deliver() is True
    assert len(sent) == 1, sent
    assert not [s for s in sent if "alert" in s.lower()], sent
    assert MetricPoint.objects.filter(run=run, line=1).count() == 2

    # Rollouts of steps off the store's grid (every 5th step): no statement at all.
    append(stream, [rollout(line) for line in range(4, 16)])  # steps 2-4
    with statements() as sent:
        assert supervisor.deliver() is True
    assert sent == []
    assert supervisor.rollouts_tail.line_no == 16

    # Step 5 is on the grid: stored, and the store learns the lines seen meanwhile.
    append(stream, [rollout(line) for line in range(16, 20)])
    with statements() as sent:
        assert supervisor.deliver() is True
    assert 0 < len(sent) <= 5, sent
    assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == [16, 17, 18, 19]
    store = RolloutStore.objects.get(run=run)
    assert store.lines_seen == 20 and store.stored == 4

    # Nothing new: nothing sent.
    with statements() as sent:
        assert supervisor.deliver() is True
        supervisor.tick()
    assert sent == []


def test_stream_lines_off_the_grid_are_passed_over_unparsed(owner: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the store's stride is known, the worker reads only the lines it can keep: at 200 live
    runs parsing the other four in five was a tenth of an ingest process's time."""
    from rl_core.common import jsonl_tail
    from rl_core.rundir.layout import ROLLOUTS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner)  # 4 samples per step, every 5th step kept
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    stream = tmp_path / ROLLOUTS_FILE
    append(stream, [rollout(line) for line in range(4)])  # step 1: read, and the store with it
    assert supervisor.deliver() is True
    parsed: list[bytes] = []
    parse = jsonl_tail.parse_record
    monkeypatch.setattr(jsonl_tail, "parse_record", lambda raw: parsed.append(raw) or parse(raw))
    append(stream, [rollout(line) for line in range(4, 24)])  # steps 2-6: only step 5 is kept
    assert supervisor.deliver() is True
    assert len(parsed) == 4  # lines 16-19
    assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == [16, 17, 18, 19]
    assert supervisor.rollouts_tail.line_no == 24 and supervisor.rollouts_tail.bad_lines == 0
    # Lines passed over still count as seen by the store (the next kept batch writes the count).
    append(stream, [rollout(line) for line in range(24, 40)])  # steps 7-10: step 10 kept
    assert supervisor.deliver() is True
    assert RolloutStore.objects.get(run=run).lines_seen == 40


def test_the_kept_alert_state_fires_once_per_episode_and_survives_a_restart(owner: Any) -> None:
    def line(n: int, **values: float) -> tuple[int, dict[str, Any]]:
        return n, {"t": 1.0 + n, "step": n, "train/loss": 1.0, **values}

    quiet = [line(n) for n in range(3)]
    bad = [line(3, **{"nonfinite/train/loss": 1.0}), line(4, **{"nonfinite/train/loss": 1.0})]
    recovered = [line(n) for n in range(5, 8)]
    bad_again = [line(8, **{"nonfinite/train/loss": 1.0})]
    run = make_run(owner)
    state = alerts.load_alert_state(run.pk)

    with statements() as sent:
        assert alerts.evaluate_metric_lines(run.pk, quiet, state) == []
    assert sent == []  # nothing starts or ends: no table touched
    fired = alerts.evaluate_metric_lines(run.pk, bad, state)
    assert [(a.rule, a.step) for a in fired] == [("nonfinite", 3)]
    assert AlertCursor.objects.get(run=run).next_line == 5  # written with the episode
    assert alerts.evaluate_metric_lines(run.pk, recovered, state) == []  # the episode ends
    assert AlertCursor.objects.get(run=run).next_line == 8

    # A restarted worker reads the state back and gets every line again: nothing fires twice,
    # and the episode that ended can start again.
    restarted = alerts.load_alert_state(run.pk)
    assert alerts.evaluate_metric_lines(run.pk, quiet + bad + recovered, restarted) == []
    assert [(a.rule, a.step) for a in alerts.evaluate_metric_lines(run.pk, bad_again, restarted)] == [("nonfinite", 8)]
    assert list(Alert.objects.filter(run=run).order_by("id").values_list("step", flat=True)) == [3, 8]

    # The same lines without a kept state (read and written per call) fire the same alerts.
    other = make_run(owner)
    for batch in (quiet, bad, recovered, bad_again):
        alerts.evaluate_metric_lines(other.pk, batch)
    assert list(Alert.objects.filter(run=other).order_by("id").values_list("step", flat=True)) == [3, 8]


def test_windows_kept_in_memory_match_the_stored_ones(owner: Any) -> None:
    """The collapse rules' rolling windows live in the supervisor between writes; a worker that
    restarts from the stored cursor reaches the same windows as one that never stopped."""
    run = make_run(owner, reward_window=3, reward_drop=0.3)
    records = [(n, {"t": 1.0 + n, "step": n, "train/reward_mean": value}) for n, value in enumerate([0.9, 0.9, 0.9, 0.8, 0.8])]
    state = alerts.load_alert_state(run.pk)
    assert alerts.evaluate_metric_lines(run.pk, records, state) == []
    restarted = alerts.load_alert_state(run.pk)
    assert restarted.next_line == 0  # nothing changed: the cursor was not written yet
    assert alerts.evaluate_metric_lines(run.pk, records, restarted) == []
    assert restarted.windows == state.windows and restarted.next_line == state.next_line == 5
    collapse = [(5, {"t": 6.0, "step": 5, "train/reward_mean": 0.1}), (6, {"t": 7.0, "step": 6, "train/reward_mean": 0.1})]
    assert [a.rule for a in alerts.evaluate_metric_lines(run.pk, collapse, state)] == ["reward_collapse"]
    assert AlertCursor.objects.get(run=run).windows == state.windows


def test_a_database_error_leaves_the_alert_state_as_it_was(owner: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(owner)
    state = alerts.load_alert_state(run.pk)
    bad = [(0, {"t": 1.0, "step": 0, "nonfinite/train/grad_norm": 1.0, "train/grad_norm": 0.0})]

    def refuse(*args: Any, **kwargs: Any) -> int:
        raise OperationalError("database away")

    monkeypatch.setattr(type(AlertCursor.objects.filter(run_id=run.pk)), "update", refuse)
    with pytest.raises(OperationalError):
        alerts.evaluate_metric_lines(run.pk, bad, state)
    monkeypatch.undo()
    assert state.next_line == 0 and state.active == set()  # the supervisor sends the batch again
    assert [a.rule for a in alerts.evaluate_metric_lines(run.pk, bad, state)] == ["nonfinite"]
    assert state.active == {("nonfinite", "")} and state.next_line == 1


def test_rollout_batches_off_the_grid_wait_for_the_next_write_to_count_their_lines(owner: Any) -> None:
    run = make_run(owner)  # 4 samples per step, every 5th step kept
    state = RolloutIngestState.for_run(run.pk)
    assert ingest_rollouts(run.pk, [(line, rollout(line)) for line in range(4)], DECODER, state) == 0  # reads the store
    assert state.stride == 5
    with statements() as sent:
        assert ingest_rollouts(run.pk, [(line, rollout(line)) for line in range(4, 12)], DECODER, state) == 0
    assert sent == [] and state.lines_seen == 12
    assert RolloutStore.objects.get(run=run).lines_seen == 4
    state.written_at -= RolloutIngestState.LINES_SEEN_EVERY_S  # a while later: the count is written
    assert ingest_rollouts(run.pk, [(line, rollout(line)) for line in range(12, 16)], DECODER, state) == 0
    assert RolloutStore.objects.get(run=run).lines_seen == 16
    assert ingest_rollouts(run.pk, [(line, rollout(line)) for line in range(16, 20)], DECODER, state) == 4
    store = RolloutStore.objects.get(run=run)
    assert (store.lines_seen, store.stored, store.stride) == (20, 4, 5)
    # Re-sent after an outage (a fresh state, as a restarted worker's): nothing twice.
    assert ingest_rollouts(run.pk, [(line, rollout(line)) for line in range(0, 20)], DECODER) == 0
    assert StoredRollout.objects.filter(run=run).count() == 4
    assert RolloutStore.objects.get(run=run).stored == 4  # counted as the insert went: only new rows


def test_kept_rows_are_stored_whole_and_pushed_with_their_ids(owner: Any, monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any) -> None:
    """Rows go in with server-side binding (not bulk_create): every column as the model reads
    it, and the live push names the stored rows' ids."""
    from inflight.live.broadcast import run_rollouts_group
    from inflight.rollouts import services as rollout_services

    sent: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(rollout_services, "push_on_commit", lambda group, message: sent.append((group, message)))
    run = make_run(owner)
    records = [(line, rollout(line)) for line in range(16, 20)]  # step 5
    records[1][1]["metadata"] = {"train_logprobs": [-0.25, -0.5, -0.75], "extracted": 42}
    with django_capture_on_commit_callbacks(execute=True):
        assert ingest_rollouts(run.pk, records, DECODER) == 4
    [(group, message)] = sent
    stored = {row.pk: row for row in StoredRollout.objects.filter(run=run)}
    assert group == run_rollouts_group(run.pk) and sorted(row["id"] for row in message["rows"]) == sorted(stored)
    assert all(stored[row["id"]].line == row["line"] for row in message["rows"])
    row = StoredRollout.objects.get(run=run, line=17)
    assert (row.step, row.seq, row.token_ids, row.versions, row.logprobs) == (5, 1, [50, 51, 52], [0, 0, 0], [-0.5] * 3)
    assert row.tokens == DECODER.pieces([50, 51, 52]) and row.completion_text == DECODER.text([50, 51, 52], skip_special=True)
    assert row.train_logprobs == [-0.25, -0.5, -0.75] and row.extracted == "42" and row.correct is True and row.length == 3
    assert StoredRollout.objects.get(run=run, line=16).train_logprobs is None


def test_one_statement_batches_fold_as_the_reference_through_grid_growth_resends_and_a_rewind(owner: Any) -> None:
    """The supervisor's one-statement ingest (`MetricsIngestState`) leaves the same points,
    snapshot and seqs as the transactional way, and falls back to it whenever what it knows no
    longer holds: the grid must widen, a batch is sent again, a resume rewound the run."""
    import random

    from downsample_oracle import snapshot_from_points

    from inflight.live.selectors import run_snapshot
    from inflight.runs.actions import supersede_rewound_history
    from inflight.live.ingest import MetricsIngestState, PointIn

    rng = random.Random(5)
    run = make_run(owner)
    state = MetricsIngestState()
    stored: list[PointIn] = []
    line = 0
    seqs = []
    batches = [range(0, 3), range(3, 4), range(4, 6), range(6, 1_500), range(1_500, 1_501), range(1_501, 1_503)]
    for steps in batches:
        batch = [PointIn(line=line + i, name=name, step=step, t=1e9 + step, value=rng.random())
                 for i, step in enumerate(steps) for name in ("a", "b")]
        line += len(steps)
        with statements() as sent:
            seqs.append(live_ingest.ingest_metrics(run.pk, batch, state))
        if steps.start in (3, 4, 1_501):  # the state holds: one statement
            assert len(sent) == 1, (steps, sent)
        stored += batch
        assert state.seq == seqs[-1]
        snapshot = run_snapshot(run)
        assert {k: snapshot[k] for k in ("shift", "max_step", "series")} == {
            k: v for k, v in snapshot_from_points([(p.name, p.step, p.t, p.value) for p in stored]).items() if k in ("shift", "max_step", "series")
        }, steps
    assert seqs == [1, 2, 3, 4, 5, 6] and snapshot["shift"] == 1  # 1,502 steps: width 2
    # Sent again (the reply was lost): nothing stored twice, no seq taken, the state still right.
    assert live_ingest.ingest_metrics(run.pk, batch, state) is None
    assert MetricPoint.objects.filter(run=run).count() == len(stored) and Run.objects.get(pk=run.pk).metrics_seq == 6
    # A resume rewinds to step 1,400: the next batch sees the cursor moved and goes the long way.
    supersede_rewound_history(run.pk, 1_400, line, 2e9)
    kept = [p for p in stored if p.step <= 1_400]
    after = [PointIn(line=line, name="a", step=1_401, t=2e9 + 1, value=0.5)]
    seq = live_ingest.ingest_metrics(run.pk, after, state)
    assert seq == Run.objects.get(pk=run.pk).metrics_seq and state.seq == seq
    snapshot = run_snapshot(run)
    expected = snapshot_from_points([(p.name, p.step, p.t, p.value) for p in kept + after])
    assert {k: snapshot[k] for k in ("shift", "max_step", "series")} == {k: expected[k] for k in ("shift", "max_step", "series")}
    with statements() as sent:
        assert live_ingest.ingest_metrics(run.pk, [PointIn(line=line + 1, name="a", step=1_402, t=2e9 + 2, value=0.25)], state) == seq + 1
    assert len(sent) == 1


def test_the_cancel_flags_of_a_workers_runs_cost_one_query_a_second(owner: Any) -> None:
    """Every supervisor asks about its run's cancel flag each second; the worker's runs are read
    together, so 3 runs asking cost one statement, and a cancel is still seen within the second."""
    import time

    from workers.tasks import PlatformReporter, SupervisedRunStatuses

    runs = [make_run(owner) for _ in range(3)]
    PlatformReporter.statuses = SupervisedRunStatuses(max_age_s=0.5)  # a fresh one: other tests' reporters left out
    try:
        reporters = [PlatformReporter(run.pk) for run in runs]
        with statements() as sent:
            assert [reporter.cancel_requested() for reporter in reporters] == [False, False, False]
        assert len(sent) == 1
        Run.objects.filter(pk=runs[1].pk).update(status="cancelling")
        with statements() as sent:
            assert reporters[1].cancel_requested() is False  # read less than max_age_s ago
        assert sent == []
        time.sleep(0.6)
        assert [reporter.cancel_requested() for reporter in reporters] == [False, True, False]
        Run.objects.filter(pk=runs[2].pk).delete()
        time.sleep(0.6)
        assert reporters[2].cancel_requested() is True  # gone from the database: stop it
    finally:
        PlatformReporter.statuses = SupervisedRunStatuses()
