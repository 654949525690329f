"""Rollout viewer storage and API on the real database: which samples are kept, idempotent
re-sends, the storage bound (thinning), filters and paging, one sample token by token, its
group, the page's JSON, exports, and the supervisor's rollout tail."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from inflight.rollouts.models import RolloutStore, StoredRollout
from inflight.rollouts.services import ingest_rollouts
from inflight.rollouts.tokens import decoder_for_model
from inflight.runs import evaluations
from inflight.runs.models import Run
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


def make_run(owner, samples_per_step: int = 4, keep_every: int = 1, max_stored: int = 5000) -> Run:
    config = {
        "trainer": {"samples_per_step": samples_per_step},
        "model": {"path": "var/models/tiny"},
        "actor": {"max_lag": 1},
        "monitoring": {"rollouts": {"keep_every_n_steps": keep_every, "max_stored": max_stored}},
    }
    return Run.objects.create(owner=owner, name="r", config=config)


def sample(line: int, samples_per_step: int = 4, *, reward: float = 1.0, versions: list[int] | None = None, length: int = 6) -> dict[str, Any]:
    group = line // 2
    versions = versions if versions is not None else [line // samples_per_step] * length
    return {
        "sample_id": f"g{group}-{line % 2}", "group_id": f"g{group}", "prompt_id": f"p{group}",
        "prompt_token_ids": [40, 41, 42], "completion_token_ids": list(range(50, 50 + len(versions))),
        "behaviour_logprobs": [-0.5] * len(versions), "token_versions": versions,
        "reward": reward, "success": reward > 0.5, "advantage": reward - 0.5, "finish_reason": "stop",
        "metadata": {"epoch": 0, "extracted": "7"},
    }


DECODER = decoder_for_model("var/models/tiny")


def test_every_nth_step_is_kept_and_resending_never_duplicates(owner) -> None:
    run = make_run(owner, samples_per_step=4, keep_every=2)
    records = [(line, sample(line)) for line in range(16)]  # steps 1..4
    assert ingest_rollouts(run.pk, records, DECODER) == 8  # steps 2 and 4
    assert sorted(set(StoredRollout.objects.filter(run=run).values_list("step", flat=True))) == [2, 4]
    assert ingest_rollouts(run.pk, records[4:], DECODER) == 0  # re-sent after an outage
    assert StoredRollout.objects.filter(run=run).count() == 8
    row = StoredRollout.objects.get(run=run, line=4)
    assert row.tokens and len(row.tokens) == len(row.token_ids) == row.length == 6
    assert "".join(row.tokens) == DECODER.text(row.token_ids)  # decoded with the model's tokenizer
    assert row.max_lag == (row.step - 1) - row.min_version and row.extracted == "7"


def test_storage_stays_bounded_by_thinning(owner) -> None:
    run = make_run(owner, samples_per_step=4, keep_every=1, max_stored=32)
    for start in range(0, 400, 40):  # 100 steps in 10 batches
        ingest_rollouts(run.pk, [(line, sample(line)) for line in range(start, start + 40)], DECODER)
        assert StoredRollout.objects.filter(run=run).count() <= 32
    store = RolloutStore.objects.get(run=run)
    steps = sorted(set(StoredRollout.objects.filter(run=run).values_list("step", flat=True)))
    assert store.stride >= 4 and all(step % store.stride == 0 for step in steps)
    assert steps[0] == store.stride and steps[-1] >= 100 - store.stride  # spread over the whole run
    assert store.stored == StoredRollout.objects.filter(run=run).count()


def test_a_token_that_decodes_to_nul_is_stored(owner) -> None:
    run = make_run(owner)
    nul_id = next(i for i in range(DECODER.tokenizer.get_vocab_size()) if "\x00" in DECODER.text([i]))
    record = sample(0)
    record["completion_token_ids"][2] = nul_id
    assert ingest_rollouts(run.pk, [(0, record)], DECODER) == 1
    assert StoredRollout.objects.get(run=run).tokens[2] == "\ufffd"


def test_stored_rows_equal_what_was_sent_whichever_way_they_travel(owner) -> None:
    """Rows go to PostgreSQL as one JSON document; one that JSON cannot carry (a NaN logprob) goes
    value by value. Both store exactly what the model field holds: quotes, backslashes, non-ASCII
    text, float arrays, absent trainer logprobs."""
    run = make_run(owner, samples_per_step=2)
    plain = sample(0, 2)
    plain["metadata"] = {"extracted": 'a "quoted" \\ back\\slash — ∑ 7', "train_logprobs": [-0.25, -1e-9, -3.5, -0.1, -0.2, -0.3]}
    plain["behaviour_logprobs"] = [-0.125, -2.5e-7, -13.0, -0.5, -0.75, -1.0]
    odd = sample(1, 2)
    odd["behaviour_logprobs"] = [float("nan"), -1.0, -1.0, -1.0, -1.0, -1.0]
    assert ingest_rollouts(run.pk, [(0, plain)], DECODER) == 1  # as JSON
    assert ingest_rollouts(run.pk, [(1, odd)], DECODER) == 1  # value by value
    first, second = StoredRollout.objects.filter(run=run).order_by("line")
    assert first.extracted == plain["metadata"]["extracted"]
    assert first.logprobs == plain["behaviour_logprobs"] and first.train_logprobs == plain["metadata"]["train_logprobs"]
    assert first.token_ids == plain["completion_token_ids"] and first.versions == plain["token_versions"]
    assert second.train_logprobs is None and second.logprobs[1:] == [-1.0] * 5 and second.logprobs[0] != second.logprobs[0]  # NaN kept


def test_malformed_lines_are_skipped(owner) -> None:
    run = make_run(owner)
    bad = sample(1)
    bad["token_versions"] = [0]  # lengths differ
    assert ingest_rollouts(run.pk, [(0, sample(0)), (1, bad), (2, {"nothing": 1})], DECODER) == 1


@pytest.fixture
def stored(owner) -> Run:
    run = make_run(owner, samples_per_step=4)
    records = []
    for line in range(24):  # steps 1..6
        step = line // 4 + 1
        versions = [step - 2, step - 2, step - 1, step - 1] if line == 21 else [max(0, step - 1)] * (4 + line % 3)
        records.append((line, sample(line, reward=1.0 if line % 2 else 0.0, versions=versions)))
    ingest_rollouts(run.pk, records, DECODER)
    return run


def test_api_lists_newest_first_filters_and_pages(owner_api, stored) -> None:
    url = f"/api/runs/{stored.pk}/rollouts/"
    page = owner_api.get(url, {"limit": 10}).json()
    lines = [r["line"] for r in page["rollouts"]]
    assert lines == list(range(23, 13, -1)) and page["next_cursor"] == 14
    rest = owner_api.get(url, {"limit": 100, "cursor": page["next_cursor"]}).json()
    assert [r["line"] for r in rest["rollouts"]] == list(range(13, -1, -1)) and rest["next_cursor"] is None
    narrowed = owner_api.get(url, {"step_min": 2, "step_max": 3, "correct": "true"}).json()["rollouts"]
    assert narrowed and all(2 <= r["step"] <= 3 and r["correct"] for r in narrowed) and len(narrowed) == 4
    long_ones = owner_api.get(url, {"length_min": 6}).json()["rollouts"]
    assert long_ones and all(r["length"] >= 6 for r in long_ones)
    assert all(r["reward"] <= 0.5 for r in owner_api.get(url, {"reward_max": 0.5}).json()["rollouts"])


@pytest.mark.parametrize("query", [{"step_min": "x"}, {"correct": "maybe"}, {"reward_min": "nan"}, {"step_min": 5, "step_max": 2}, {"limit": 0}])
def test_bad_filters_are_400(owner_api, stored, query) -> None:
    response = owner_api.get(f"/api/runs/{stored.pk}/rollouts/", query)
    assert response.status_code == 400 and "error" in response.json()


def test_only_owner_and_staff_see_rollouts(other_api, staff_api, anonymous_api, stored) -> None:
    row = StoredRollout.objects.filter(run=stored).first()
    for url in (f"/api/runs/{stored.pk}/rollouts/", f"/api/runs/{stored.pk}/rollouts/{row.pk}/", f"/api/runs/{stored.pk}/alerts/",
                f"/api/runs/{stored.pk}/export/rollouts.jsonl"):
        assert other_api.get(url).status_code == 404, url
        assert anonymous_api.get(url).status_code == 401, url
        assert staff_api.get(url).status_code == 200, url


def test_sample_detail_shows_versions_and_the_switch_and_its_group(owner_api, stored) -> None:
    row = StoredRollout.objects.get(run=stored, line=21)
    detail = owner_api.get(f"/api/runs/{stored.pk}/rollouts/{row.pk}/").json()
    assert detail["versions"] == [4, 4, 5, 5] and detail["version_switches"] == [2]
    assert detail["versions_spanned"] == 2 and detail["max_lag"] == 1 and len(detail["tokens"]) == 4
    assert detail["ratios"] is None  # the trainer's logprobs are not in the stream
    assert detail["ratios_missing"].startswith("no trainer logprobs")
    group = owner_api.get(f"/api/runs/{stored.pk}/rollouts/{row.pk}/group/").json()
    assert {s["line"] for s in group["samples"]} == {20, 21} and all("advantage" in s for s in group["samples"])
    assert owner_api.get(f"/api/runs/{stored.pk}/rollouts/999999/").status_code == 404


def test_page_json_endpoints_and_rollouts_tab(client, owner, other_user, stored) -> None:
    client.force_login(owner)
    page = client.get(f"/runs/{stored.pk}/")
    assert page.status_code == 200 and b'id="rollouts-panel"' in page.content and b"rollouts.js" in page.content
    data = client.get(f"/runs/{stored.pk}/rollouts.json", {"step_min": 6}).json()
    assert {r["step"] for r in data["rollouts"]} == {6}
    assert client.get(f"/runs/{stored.pk}/rollouts.json", {"correct": "x"}).status_code == 400
    client.force_login(other_user)
    assert client.get(f"/runs/{stored.pk}/rollouts.json").status_code == 404


def test_exports(owner_api, owner, stored) -> None:
    live_ingest.ingest_metrics(stored.pk, [PointIn(line=0, name="train/loss", step=1, t=10.0, value=0.5), PointIn(line=1, name="train/loss", step=2, t=11.0, value=0.25)])
    evaluations.ingest_eval(stored.pk, {"benchmark": "math500", "step": 2, "k": 2, "mean_at_k": 0.5, "pass_at_k": 1.0, "num_problems": 1, "num_samples": 2},
                         [{"problem_id": "p1", "answer": "3", "samples": ["a", "b"], "extracted": ["3", None], "verdicts": [True, False], "mean": 0.5, "pass": True}])
    base = f"/api/runs/{stored.pk}/export/"
    rows = list(csv.DictReader(io.StringIO(b"".join(owner_api.get(base + "metrics.csv").streaming_content).decode())))
    assert [(r["name"], r["step"], float(r["value"])) for r in rows] == [("train/loss", "1", 0.5), ("train/loss", "2", 0.25)]
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(owner_api.get(base + "metrics.parquet").content))
    assert table.column("value").to_pylist() == [0.5, 0.25] and table.column("step").to_pylist() == [1, 2]
    lines = b"".join(owner_api.get(base + "rollouts.jsonl").streaming_content).decode().splitlines()
    assert len(lines) == 24 and json.loads(lines[21])["versions"] == [4, 4, 5, 5]
    evals = [json.loads(line) for line in b"".join(owner_api.get(base + "evals.jsonl").streaming_content).decode().splitlines()]
    assert evals == [{"benchmark": "math500", "step": 2, "k": 2, "policy_versions": [], "problem_id": "p1", "answer": "3", "samples": ["a", "b"],
                      "extracted": ["3", None], "verdicts": [True, False], "mean": 0.5, "pass": True, "used_tool": None, "samples_used_tool": None}]
    response = owner_api.get(base + "nope.txt")
    assert response.status_code == 404 and "metrics.csv" in response.json()["error"]


def test_supervisor_tails_the_stream_and_retries_what_the_database_refused(owner, tmp_path: Path) -> None:
    from rl_core.rundir.layout import ROLLOUTS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    path = tmp_path / ROLLOUTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(sample(line)) + "\n" for line in range(8)) + '{"torn": ')

    class FlakyReporter(PlatformReporter):
        fail = True

        def rollouts(self, records, lines_read):
            if self.fail:
                self.fail = False
                raise ConnectionError("database away")
            return super().rollouts(records, lines_read)

    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=FlakyReporter(run.pk), cwd=tmp_path)
    assert supervisor.deliver() is False  # refused: nothing committed, the tail did not move
    assert StoredRollout.objects.filter(run=run).count() == 0 and supervisor.rollouts_tail.line_no == 0
    assert supervisor.deliver() is True
    assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == list(range(8))
    assert supervisor.rollouts_tail.line_no == 8  # the torn last line waits for its end


@pytest.mark.django_db(transaction=True)
def test_the_worker_stores_the_stream_on_its_writer_thread_and_moves_on_meanwhile(owner, tmp_path: Path, hold_writes: Any) -> None:
    """Outside a transaction (a worker) a poll's stream lines go to the process's rollout writer:
    the supervisor goes on at once, and is not done until the writer stored them."""
    from inflight.rollouts import services as rollout_services
    from rl_core.rundir.layout import ROLLOUTS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    path = tmp_path / ROLLOUTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(sample(line)) + "\n" for line in range(8)))
    released = hold_writes(rollout_services, "ingest_rollouts")
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    assert supervisor.deliver() is False  # handed over, not stored yet
    assert StoredRollout.objects.filter(run=run).count() == 0 and supervisor.rollouts_tail.line_no == 0
    released.set()
    outcomes = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        outcomes.append(supervisor.deliver())
        if outcomes[-1]:
            break
        time.sleep(0.02)
    assert outcomes[-1] is True
    assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == list(range(8))
    assert supervisor.rollouts_tail.line_no == 8
    from django.db import connection

    connection.close()


def test_trainer_logprobs_attach_to_stored_samples_and_give_ratios(owner_api, owner) -> None:
    from inflight.rollouts.services import attach_train_logprobs

    run = make_run(owner, samples_per_step=4)
    ingest_rollouts(run.pk, [(line, sample(line)) for line in range(4)], DECODER)
    train = [-0.5, -0.25, -1.5, -0.5, -0.5, 0.0]  # behaviour logprobs are all -0.5
    records = [
        {"sample_id": "g0-0", "step": 1, "consumed": 4, "logprobs": train},
        {"sample_id": "g0-1", "step": 1, "consumed": 4, "logprobs": [-0.5] * 5},  # wrong length: ignored
        {"sample_id": "g9-9", "step": 1, "consumed": 4, "logprobs": train},  # not stored: ignored
        {"sample_id": 3, "logprobs": "x"},  # malformed: ignored
    ]
    assert attach_train_logprobs(run.pk, records) == 1
    assert attach_train_logprobs(run.pk, records) == 1  # a re-sent batch writes the same values
    row = StoredRollout.objects.get(run=run, sample_id="g0-0")
    assert row.train_logprobs == train
    assert StoredRollout.objects.get(run=run, sample_id="g0-1").train_logprobs is None
    detail = owner_api.get(f"/api/runs/{run.pk}/rollouts/{row.pk}/").json()
    import math

    assert detail["ratios"] == pytest.approx([math.exp(t + 0.5) for t in train])
    assert detail["train_logprobs"] == train
    exported = [json.loads(line) for line in b"".join(owner_api.get(f"/api/runs/{run.pk}/export/rollouts.jsonl").streaming_content).decode().splitlines()]
    assert next(r for r in exported if r["sample_id"] == "g0-0")["train_logprobs"] == train  # the export carries them too


def test_supervisor_attaches_trainer_logprobs_once_their_stream_lines_are_stored(owner, tmp_path: Path) -> None:
    from rl_core.rundir.layout import ROLLOUTS_FILE, TRAIN_LOGPROBS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    stream = tmp_path / ROLLOUTS_FILE
    stream.parent.mkdir(parents=True)
    stream.write_text("".join(json.dumps(sample(line)) + "\n" for line in range(4)))
    # Step 2's record (it covers stream lines 0-7) is written before lines 4-7 reach the platform.
    (tmp_path / TRAIN_LOGPROBS_FILE).write_text(
        json.dumps({"sample_id": "g0-0", "step": 1, "consumed": 4, "logprobs": [-0.25] * 6}) + "\n"
        + json.dumps({"sample_id": "g2-0", "step": 2, "consumed": 8, "logprobs": [-0.75] * 6}) + "\n"
    )

    class FlakyReporter(PlatformReporter):
        fail = True

        def train_logprobs(self, records):
            if self.fail:
                self.fail = False
                raise ConnectionError("database away")
            return super().train_logprobs(records)

    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=FlakyReporter(run.pk), cwd=tmp_path)
    assert supervisor.deliver() is False  # rollouts stored, the logprobs refused: kept for the next poll
    assert StoredRollout.objects.get(run=run, sample_id="g0-0").train_logprobs is None
    assert supervisor.deliver() is True
    assert StoredRollout.objects.get(run=run, sample_id="g0-0").train_logprobs == [-0.25] * 6
    assert [r["sample_id"] for r in supervisor.train_logprobs_waiting] == ["g2-0"]  # its stream lines are not in yet
    with stream.open("a") as handle:
        handle.write("".join(json.dumps(sample(line)) + "\n" for line in range(4, 8)))
    assert supervisor.deliver() is True
    assert StoredRollout.objects.get(run=run, sample_id="g2-0").train_logprobs == [-0.75] * 6
    assert supervisor.train_logprobs_waiting == []


def test_without_a_stream_file_trainer_logprobs_are_not_held(owner, tmp_path: Path) -> None:
    from workers.supervisor import TRAIN_LOGPROBS_FILE, RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner)
    (tmp_path / TRAIN_LOGPROBS_FILE).write_text(json.dumps({"sample_id": "g0-0", "step": 1, "consumed": 4, "logprobs": [0.0]}) + "\n")
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    assert supervisor.deliver() is True  # nothing is pending: there is no stream to attach to
    assert supervisor.train_logprobs_waiting == []


def test_a_redis_stream_run_fills_the_viewer_like_a_file_stream(owner, tmp_path: Path) -> None:
    from rl_core.common.contracts import RolloutSample
    from rl_core.rundir.layout import REDIS_DIR
    from rl_core.rundir.stream import RedisStreamWriter, redis_stream_key, start_redis_server
    from workers.supervisor import TRAIN_LOGPROBS_FILE, RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    process, url = start_redis_server(tmp_path / REDIS_DIR)  # where the launcher's embedded server lives
    try:
        writer = RedisStreamWriter(url, redis_stream_key(tmp_path))
        writer.append([RolloutSample.from_json(sample(line)) for line in range(6)])
        config_yaml = "stream:\n  kind: redis\n  redis_embedded: true\n"
        supervisor = RunSupervisor(run_dir=tmp_path, config_yaml=config_yaml, command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
        assert supervisor.deliver() is True
        assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == list(range(6))
        writer.append([RolloutSample.from_json(sample(line)) for line in range(6, 8)])
        (tmp_path / TRAIN_LOGPROBS_FILE).write_text(json.dumps({"sample_id": "g3-1", "step": 2, "consumed": 8, "logprobs": [-0.125] * 6}) + "\n")
        assert supervisor.deliver() is True
        assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == list(range(8))  # numbered in stream order
        assert StoredRollout.objects.get(run=run, line=7).train_logprobs == [-0.125] * 6
        writer.close()
    finally:
        process.terminate()
        process.wait(10)
    # The run's server stopped with the run: nothing more to read, and nothing counted as undelivered.
    assert supervisor.deliver() is True and supervisor.rollouts_tail.line_no == 8


def test_rollouts_an_embedded_redis_run_wrote_after_the_last_poll_still_reach_the_viewer(owner, tmp_path: Path) -> None:
    """The run's private Redis stops with the run, with what the actor wrote since the
    supervisor's last poll unread: the final drain starts it again on its append-only file."""
    from rl_core.common.contracts import RolloutSample
    from rl_core.rundir.layout import REDIS_DIR
    from rl_core.rundir.stream import RedisStreamWriter, redis_stream_key, start_redis_server
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    process, url = start_redis_server(tmp_path / REDIS_DIR)
    writer = RedisStreamWriter(url, redis_stream_key(tmp_path))
    writer.append([RolloutSample.from_json(sample(line)) for line in range(4)])
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="stream:\n  kind: redis\n  redis_embedded: true\n",
                               command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    supervisor.drain_timeout_s = 5.0
    assert supervisor.deliver() is True
    writer.append([RolloutSample.from_json(sample(line)) for line in range(4, 7)])  # after the last poll
    writer.close()
    process.terminate()  # the run ends: its launcher stops the private server
    process.wait(10)
    assert supervisor.deliver() is True and supervisor.rollouts_tail.line_no == 4  # unreachable now
    supervisor.final_drain()
    assert sorted(StoredRollout.objects.filter(run=run).values_list("line", flat=True)) == list(range(7))
    # The restarted server is stopped again: nothing of the run keeps running.
    import redis

    with pytest.raises((redis.ConnectionError, OSError)):
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()


def test_a_zero_advantage_sample_says_why_it_has_no_ratios(owner_api, owner) -> None:
    """The trainer computes only samples with a gradient: one whose advantage is 0 never gets
    trainer logprobs, and the viewer says so instead of "not trained yet"."""
    run = make_run(owner, samples_per_step=4)
    ingest_rollouts(run.pk, [(line, sample(line, reward=0.5)) for line in range(2)], DECODER)  # advantage 0
    row = StoredRollout.objects.filter(run=run).first()
    detail = owner_api.get(f"/api/runs/{run.pk}/rollouts/{row.pk}/").json()
    assert detail["advantage"] == 0.0 and detail["ratios"] is None
    assert detail["ratios_missing"].startswith("advantage 0")
    # With a KL penalty such a sample has a gradient: it is trained, only not yet.
    run.config["trainer"]["kl_coef"] = 0.1
    run.save(update_fields=["config"])
    assert owner_api.get(f"/api/runs/{run.pk}/rollouts/{row.pk}/").json()["ratios_missing"].startswith("no trainer logprobs")


def discarded_sample(stream_line: int, reason: str, index: int, samples_per_step: int = 4) -> dict[str, Any]:
    """A line of stream/discarded.jsonl: a RolloutSample with its reason and stream position."""
    record = sample(stream_line, samples_per_step, reward=1.0)
    record.update({"sample_id": f"d{stream_line}-{index}", "group_id": f"d{stream_line}", "advantage": 0.0, "discarded": reason})
    record["metadata"] = {**record["metadata"], "stream_line": stream_line}
    return record


def test_discarded_samples_are_stored_with_their_reason_on_the_stream_grid(owner) -> None:
    """A discarded sample is filed under the step of the stream position it was discarded at, kept
    on the same step grid as the trained ones, keyed by its line in discarded.jsonl (a re-send adds
    nothing), and its reason is stored; it never collides with the trained sample of that line."""
    run = make_run(owner, samples_per_step=4, keep_every=2)
    ingest_rollouts(run.pk, [(line, sample(line)) for line in range(16)], DECODER)  # steps 2 and 4 kept
    discarded = [(0, discarded_sample(0, "zero_advantage", 0)), (1, discarded_sample(4, "zero_advantage", 0)),
                 (2, discarded_sample(4, "zero_advantage", 1)), (3, discarded_sample(13, "aborted", 0)),
                 (4, {"sample_id": "no reason", "metadata": {"stream_line": 4}})]
    assert ingest_rollouts(run.pk, discarded, DECODER, discarded=True) == 3  # step 1 is off the grid
    assert ingest_rollouts(run.pk, discarded[1:], DECODER, discarded=True) == 0  # re-sent
    rows = StoredRollout.objects.filter(run=run).exclude(discarded="").order_by("discard_line")
    assert [(r.discard_line, r.line, r.step, r.discarded) for r in rows] == [
        (1, 4, 2, "zero_advantage"), (2, 4, 2, "zero_advantage"), (3, 13, 4, "aborted")]
    assert StoredRollout.objects.get(run=run, line=4, discard_line=None).discarded == ""  # the trained one of line 4 is kept
    assert RolloutStore.objects.get(run=run).stored == StoredRollout.objects.filter(run=run).count() == 11
    assert RolloutStore.objects.get(run=run).lines_seen == 16  # discarded lines are not stream lines


@pytest.fixture
def with_discarded(owner) -> Run:
    run = make_run(owner, samples_per_step=4)
    ingest_rollouts(run.pk, [(line, sample(line)) for line in range(12)], DECODER)  # steps 1..3
    ingest_rollouts(run.pk, [(0, discarded_sample(4, "zero_advantage", 0)), (1, discarded_sample(4, "zero_advantage", 1)),
                             (2, discarded_sample(10, "aborted", 0))], DECODER, discarded=True)
    return run


def test_api_filters_trained_and_discarded_by_reason_with_counts(owner_api, with_discarded) -> None:
    url = f"/api/runs/{with_discarded.pk}/rollouts/"
    everything = owner_api.get(url, {"limit": 100}).json()
    assert everything["counts"] == {"trained": 12, "zero_advantage": 2, "aborted": 1}
    from inflight.api import schema

    schema.RolloutPage.model_validate(everything)  # the documented model (unknown fields refused)
    # Newest first; a discarded sample sits after the trained one of the line it would have had.
    order = [(r["line"], r["discarded"]) for r in everything["rollouts"]]
    assert order[:3] == [(11, None), (10, None), (10, "aborted")]
    assert order[-7:-4] == [(4, None), (4, "zero_advantage"), (4, "zero_advantage")]
    trained = owner_api.get(url, {"discarded": "false"}).json()["rollouts"]
    assert len(trained) == 12 and all(r["discarded"] is None for r in trained)
    dropped = owner_api.get(url, {"discarded": "true"}).json()["rollouts"]
    assert [(r["sample_id"], r["discarded"], r["step"]) for r in dropped] == [
        ("d10-0", "aborted", 3), ("d4-1", "zero_advantage", 2), ("d4-0", "zero_advantage", 2)]
    by_reason = owner_api.get(url, {"discarded": "zero_advantage", "step_min": 2}).json()
    assert [r["sample_id"] for r in by_reason["rollouts"]] == ["d4-1", "d4-0"]
    assert by_reason["counts"] == {"trained": 8, "zero_advantage": 2, "aborted": 1}  # the other filters apply
    assert owner_api.get(url, {"discarded": "Drop table"}).status_code == 400
    # Paging never splits a line: all three rows of line 4 land on one page.
    seen, cursor = [], None
    while True:
        page = owner_api.get(url, {"limit": 5, **({"cursor": cursor} if cursor is not None else {})}).json()
        assert (page["counts"] is None) == (cursor is not None)
        seen += [r["id"] for r in page["rollouts"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(r["id"] for r in everything["rollouts"]) and len(seen) == len(set(seen)) == 15


def test_a_discarded_sample_says_why_and_shows_in_its_group(owner_api, client, owner, with_discarded) -> None:
    row = StoredRollout.objects.get(run=with_discarded, sample_id="d4-0")
    detail = owner_api.get(f"/api/runs/{with_discarded.pk}/rollouts/{row.pk}/").json()
    assert detail["discarded"] == "zero_advantage" and detail["ratios"] is None
    assert detail["ratios_missing"].startswith("discarded (zero_advantage)")
    from inflight.api import schema

    schema.RolloutDetail.model_validate(detail)
    group = owner_api.get(f"/api/runs/{with_discarded.pk}/rollouts/{row.pk}/group/").json()
    assert [(s["sample_id"], s["discarded"]) for s in group["samples"]] == [("d4-0", "zero_advantage"), ("d4-1", "zero_advantage")]
    client.force_login(owner)
    page = client.get(f"/runs/{with_discarded.pk}/")
    assert b'name="discarded"' in page.content and b'id="rollouts-counts"' in page.content
    data = client.get(f"/runs/{with_discarded.pk}/rollouts.json", {"discarded": "aborted"}).json()
    assert [r["sample_id"] for r in data["rollouts"]] == ["d10-0"] and data["counts"]["aborted"] == 1
    export = b"".join(owner_api.get(f"/api/runs/{with_discarded.pk}/export/rollouts.jsonl").streaming_content).decode()
    assert sum(json.loads(line)["discarded"] is not None for line in export.splitlines()) == 3


def test_supervisor_delivers_what_the_actor_discarded(owner, tmp_path: Path) -> None:
    """The actor's own writer (rl_core.actor.discarded) makes the file; the supervisor tails it next
    to the stream and the viewer stores each sample with its reason."""
    from rl_core.actor.discarded import DiscardedSamples
    from rl_core.common.contracts import RolloutSample
    from rl_core.rundir.layout import ROLLOUTS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    path = tmp_path / ROLLOUTS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(sample(line)) + "\n" for line in range(4)))
    writer = DiscardedSamples(tmp_path, samples_per_step=4, keep_every_n_steps=1)
    plain = {k: v for k, v in sample(0).items()}
    writer.record([(RolloutSample.from_json({**plain, "sample_id": "g9-0", "group_id": "g9"}), "zero_advantage"),
                   (RolloutSample.from_json({**plain, "sample_id": "g9-1", "group_id": "g9", "finish_reason": "abort"}), "aborted")], 4)
    writer.close()
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    assert supervisor.deliver() is True
    rows = StoredRollout.objects.filter(run=run).exclude(discarded="").order_by("discard_line")
    assert [(r.sample_id, r.discarded, r.step, r.line) for r in rows] == [("g9-0", "zero_advantage", 2, 4), ("g9-1", "aborted", 2, 4)]
    assert supervisor.discarded_tail.line_no == 2 and StoredRollout.objects.filter(run=run, discarded="").count() == 4


def test_a_sample_the_trainer_dropped_as_stale_is_marked(owner_api, owner, tmp_path: Path) -> None:
    """The trainer says which stream samples it dropped (a train_logprobs.jsonl line with
    `discarded: stale`); the supervisor hands it over once that stream line is stored, and the row
    is shown as discarded, not trained."""
    from rl_core.rundir.layout import ROLLOUTS_FILE, TRAIN_LOGPROBS_FILE
    from workers.supervisor import RunSupervisor
    from workers.tasks import PlatformReporter

    run = make_run(owner, samples_per_step=4)
    (tmp_path / ROLLOUTS_FILE).parent.mkdir(parents=True)
    (tmp_path / TRAIN_LOGPROBS_FILE).write_text(json.dumps({"sample_id": "g1-0", "step": 1, "consumed": 4, "discarded": "stale"}) + "\n")
    supervisor = RunSupervisor(run_dir=tmp_path, config_yaml="", command_prefix=[], reporter=PlatformReporter(run.pk), cwd=tmp_path)
    (tmp_path / ROLLOUTS_FILE).write_text("".join(json.dumps(sample(line)) + "\n" for line in range(2)))
    assert supervisor.deliver() is True and supervisor.train_logprobs_waiting  # line 2 is not read yet: it waits
    (tmp_path / ROLLOUTS_FILE).write_text("".join(json.dumps(sample(line)) + "\n" for line in range(4)))
    assert supervisor.deliver() is True and not supervisor.train_logprobs_waiting
    assert StoredRollout.objects.get(run=run, sample_id="g1-0").discarded == "stale"
    page = owner_api.get(f"/api/runs/{run.pk}/rollouts/", {"discarded": "stale"}).json()
    assert [r["sample_id"] for r in page["rollouts"]] == ["g1-0"] and page["counts"] == {"trained": 3, "stale": 1}


def test_the_tab_asks_for_its_counts_alone_under_its_filters(client, owner, other_user, with_discarded) -> None:
    """What rollouts.js asks again while live rows arrive: the counts of the first page, without its rows."""
    client.force_login(owner)
    url = f"/runs/{with_discarded.pk}/rollouts/counts.json"
    assert client.get(url).json() == {"run": with_discarded.pk, "counts": {"trained": 12, "zero_advantage": 2, "aborted": 1}}
    assert client.get(url, {"step_min": 3, "discarded": "aborted"}).json()["counts"] == client.get(
        f"/runs/{with_discarded.pk}/rollouts.json", {"step_min": 3, "discarded": "aborted"}).json()["counts"]
    assert client.get(url, {"step_min": "x"}).status_code == 400
    client.force_login(other_user)
    assert client.get(url).status_code == 404


def test_a_push_larger_than_its_bound_says_how_many_rows_it_left_out(owner, monkeypatch, django_capture_on_commit_callbacks) -> None:
    from inflight.rollouts import services as rollout_services

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(rollout_services, "push_on_commit", lambda group, message: sent.append(message))
    monkeypatch.setattr(rollout_services, "PUSH_ROWS", 3)
    run = make_run(owner)
    with django_capture_on_commit_callbacks(execute=True):
        ingest_rollouts(run.pk, [(line, sample(line)) for line in range(8)], DECODER)
        ingest_rollouts(run.pk, [(line, sample(line)) for line in range(8, 10)], DECODER)
    assert [([r["line"] for r in m["rows"]], m["more"]) for m in sent] == [([5, 6, 7], 5), ([8, 9], 0)]
