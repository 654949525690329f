"""The JSON API through Django's test client on the real database: create, list, get, cancel, metrics, evals."""

from __future__ import annotations

import json

import pytest

from inflight.runs import evaluations, services
from inflight.runs.models import Run
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


def post(client, url, data=None, raw=None, content_type="application/json"):
    body = raw if raw is not None else json.dumps(data or {})
    return client.post(url, body, content_type=content_type)


def test_create_list_get_run(owner_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=False):
        response = post(owner_api, "/api/runs/", {"name": "api run", "config": tiny_config})
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["status"] == "queued" and created["queue"] == "cpu" and created["name"] == "api run"
    assert created["config"]["trainer"]["max_steps"] == 2
    listed = owner_api.get("/api/runs/").json()["runs"]
    assert [run["id"] for run in listed] == [created["id"]]
    assert owner_api.get("/api/runs/?status=queued").json()["runs"][0]["id"] == created["id"]
    assert owner_api.get("/api/runs/?status=running").json()["runs"] == []
    detail = owner_api.get(f"/api/runs/{created['id']}/").json()
    assert detail["id"] == created["id"] and detail["metrics_seq"] == 0


@pytest.mark.parametrize(
    ("body", "content_type", "status", "needle"),
    [
        ("{not json", "application/json", 400, "not valid JSON"),
        ("[1, 2]", "application/json", 400, "JSON object"),
        ('{"config": {"trainer": {"max_steps": -1}}}', "application/json", 400, "trainer.max_steps"),
        ('{"config": {"bogus_section": 1}}', "application/json", 400, "bogus_section"),
        ('{"config": "yaml please"}', "application/json", 400, "mapping"),
        ('{"name": 5, "config": {}}', "application/json", 400, "'name' must be a string"),
        ('{"nmae": "x", "config": {}}', "application/json", 400, "unknown field"),
        ("name=x", "application/x-www-form-urlencoded", 415, "send JSON"),
    ],
)
def test_malformed_create_is_a_clear_4xx(owner_api, body, content_type, status, needle) -> None:
    response = post(owner_api, "/api/runs/", raw=body, content_type=content_type)
    assert response.status_code == status, response.content
    assert needle in response.json()["error"]
    assert Run.objects.count() == 0


def test_field_errors_are_keyed_by_path(owner_api) -> None:
    response = post(owner_api, "/api/runs/", {"config": {"trainer": {"lr": 0}, "actor": {"group_size": "many"}}})
    fields = response.json()["fields"]
    assert set(fields) == {"trainer.lr", "actor.group_size"}


@pytest.mark.parametrize(
    "url",
    ["/api/runs/?status=exploded", "/api/runs/?limit=abc", "/api/leaderboard/?sort=secret", "/api/runs/?limit=0"],
)
def test_malformed_queries_are_400(owner_api, url) -> None:
    response = owner_api.get(url)
    assert response.status_code == 400 and response.json()["error"]


def test_wrong_method_is_405(owner_api) -> None:
    response = owner_api.delete("/api/runs/")
    assert response.status_code == 405 and "GET, POST" in response["Allow"]
    assert owner_api.get("/api/runs/1/cancel/").status_code == 405


def test_metrics_raw_since_seq_and_snapshot(owner_api, owner) -> None:
    run = services.create_run(owner, "m", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(i, "loss", i, 100.0 + i, 1.0 / (i + 1)) for i in range(5)])
    live_ingest.ingest_metrics(run.pk, [PointIn(i, "loss", i, 100.0 + i, 1.0 / (i + 1)) for i in range(5, 8)])
    live_ingest.ingest_metrics(run.pk, [PointIn(i, "reward", i, 100.0 + i, 0.5) for i in range(8)])
    raw = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=1").json()
    assert raw["seq"] == 3 and len(raw["points"]) == 3 + 8 and not raw["truncated"]
    only_loss = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0&names=loss").json()
    assert [p[1] for p in only_loss["points"]] == list(range(8)) and {p[0] for p in only_loss["points"]} == {"loss"}
    # Pages end at batch boundaries, so the returned cursor continues without gaps or repeats.
    page = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0&limit=7").json()
    assert page["truncated"] and page["seq"] == 1 and len(page["points"]) == 5  # batch 1 only
    page = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=1&limit=7").json()
    assert page["truncated"] and page["seq"] == 2 and [p[1] for p in page["points"]] == [5, 6, 7]
    big = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=2&limit=3").json()
    assert big["seq"] == 3 and len(big["points"]) == 8 and not big["truncated"]  # a batch is never split
    pages, cursor = [], 0
    while True:
        page = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq={cursor}&limit=4").json()
        pages += page["points"]
        cursor = page["seq"]
        if not page["truncated"]:
            break
    assert len(pages) == 16 and cursor == 3
    snapshot = owner_api.get(f"/api/runs/{run.pk}/metrics/").json()
    assert snapshot["seq"] == 3 and set(snapshot["series"]) == {"loss", "reward"}
    assert owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=-1").status_code == 400
    assert owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=x").status_code == 400


def test_evals_and_eval_detail(owner_api, other_api, owner) -> None:
    run = services.create_run(owner, "e", {})
    line = {"t": 1.0, "step": 2, "benchmark": "aime24", "k": 2, "mean_at_k": 0.5, "pass_at_k": 1.0, "stderr": 0.5, "num_problems": 1, "num_samples": 2, "policy_versions": [2]}
    rows = [{"problem_id": "2024-I-1", "answer": "204", "samples": ["\\boxed{204}", "no"], "extracted": ["204", None], "verdicts": [True, False], "mean": 0.5, "pass": True}]
    score = evaluations.ingest_eval(run.pk, line, rows)
    evals = owner_api.get(f"/api/runs/{run.pk}/evals/").json()["evals"]
    assert [(e["benchmark"], e["step"], e["mean_at_k"]) for e in evals] == [("aime24", 2, 0.5)]
    detail = owner_api.get(f"/api/evals/{score.pk}/").json()
    assert detail["problems"][0]["problem_id"] == "2024-I-1" and detail["problems"][0]["verdicts"] == [True, False]
    assert other_api.get(f"/api/evals/{score.pk}/").status_code == 404


def test_cancel_through_the_api(owner_api, owner) -> None:
    run = services.create_run(owner, "c", {})
    response = post(owner_api, f"/api/runs/{run.pk}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    again = post(owner_api, f"/api/runs/{run.pk}/cancel/")
    assert again.status_code == 409 and "already ended" in again.json()["error"]


def test_leaderboard_and_workers(owner_api, staff_api, owner) -> None:
    run = services.create_run(owner, "l", {})
    services.record_heartbeat("w@h", hostname="h", queues=["cpu"], gpus=[], cpu_count=2)
    rows = owner_api.get("/api/leaderboard/?sort=name").json()["rows"]
    assert [row["run_id"] for row in rows] == [run.pk]
    workers = owner_api.get("/api/workers/").json()["workers"]
    # Users see capacity, not infrastructure; staff see the node names and hosts.
    assert workers[0]["name"] == "worker 1" and workers[0]["hostname"] == "" and workers[0]["alive"] and workers[0]["cpu_count"] == 2
    staff_view = staff_api.get("/api/workers/").json()["workers"]
    assert staff_view[0]["name"] == "w@h" and staff_view[0]["hostname"] == "h"


def test_create_token_command_prints_a_working_token(owner) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command
    from django.test import Client

    out = StringIO()
    call_command("create_token", "owner", stdout=out)
    key = out.getvalue().strip()
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 200
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_token", "ghost")
