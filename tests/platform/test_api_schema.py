"""Every endpoint's real answer fits the served OpenAPI document, strictly: each call below is
checked with jsonschema (Draft 2020-12, OpenAPI 3.1's dialect) against the schema the document
gives for that path, method and status — so an undocumented status, a missing field or a field
the document does not name fails — and every object the document describes forbids unknown
fields. Error answers are checked the same way. A route nobody calls here fails the last check."""

from __future__ import annotations

import re
from typing import Any, Iterator

import pytest
from django.conf import settings
from jsonschema import Draft202012Validator

from inflight.alerts.models import Alert
from inflight.rollouts.models import StoredRollout
from inflight.runs import evaluations, run_paths, services
from inflight.runs.models import Run, RunStatus
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest
from tests.platform.test_datasets import GOOD, dataset_roots, upload  # noqa: F401 - dataset_roots: each test's own data folders (autouse)
from tests.platform.test_mirror_downloads import mirrored_run
from tests.platform.test_run_actions_api import write_checkpoint

pytestmark = pytest.mark.django_db


def _objects(node: Any, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if "properties" in node:
            yield where, node
        for key, value in node.items():
            yield from _objects(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _objects(value, f"{where}/{index}")


class Checker:
    """Validates answers against the served document and remembers which operations answered 2xx."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.answered: set[tuple[str, str]] = set()
        self.statuses: set[tuple[str, str, int]] = set()

    def template(self, path: str) -> str:
        path = path.split("?")[0]
        for template in self.document["paths"]:
            if re.fullmatch(re.sub(r"\\\{\w+\\\}", r"[^/]+", re.escape(template)), path):
                return template
        raise AssertionError(f"{path} is not in the document")

    def __call__(self, response: Any, method: str, path: str, status: int) -> Any:
        assert response.status_code == status, (method, path, response.status_code, response.content[:300])
        template = self.template(path)
        operation = self.document["paths"][template][method]
        documented = operation["responses"].get(str(status))
        assert documented, f"{method.upper()} {template} answered {status}, which its document does not list"
        content_type = response["Content-Type"].split(";")[0]
        self.statuses.add((template, method, status))
        if 200 <= status < 300:
            self.answered.add((template, method))
        if content_type != "application/json":  # a download: documented as a file, not JSON
            assert "application/json" not in documented["content"], (template, content_type)
            return response
        schema = documented["content"]["application/json"]["schema"]
        errors = sorted(Draft202012Validator({**schema, "components": self.document["components"]}).iter_errors(response.json()), key=str)
        assert not errors, f"{method.upper()} {path} → {status} does not fit the document: " + "; ".join(
            f"{'/'.join(map(str, error.absolute_path))}: {error.message[:300]}" for error in errors[:5]
        )
        return response.json()


@pytest.fixture
def document(anonymous_api) -> dict[str, Any]:
    return anonymous_api.get("/api/openapi.json").json()


def _bodies(document: dict[str, Any]) -> dict[str, Any]:
    """Every request and answer body schema of the document, with the components they refer to
    (query parameter groups are components too, but a query may carry parameters it ignores)."""
    bodies = {f"{method} {path}": [operation.get("requestBody"), operation["responses"]]
              for path, methods in document["paths"].items() for method, operation in methods.items()}
    names, pending = set(), re.findall(r"#/components/schemas/(\w+)", str(bodies))
    while pending:
        name = pending.pop()
        if name not in names:
            names.add(name)
            pending += re.findall(r"#/components/schemas/(\w+)", str(document["components"]["schemas"][name]))
    return {**bodies, **{name: document["components"]["schemas"][name] for name in names}}


def test_every_described_object_forbids_unknown_fields(document) -> None:
    bodies = _bodies(document)
    assert {"Run", "Error", "RunCreate", "EvalProblem", "LeaderboardRow"} <= set(bodies)
    loose = [where for where, node in _objects(bodies) if node.get("additionalProperties") is not False]
    assert loose == []


def test_the_document_names_the_fields_the_api_sends(document) -> None:
    """`pass` (not `pass_`), all eight statuses and every queue from the model, the limits the views use."""
    schemas = document["components"]["schemas"]
    assert "pass" in schemas["EvalProblem"]["properties"] and "pass_" not in schemas["EvalProblem"]["properties"]
    assert schemas["Run"]["properties"]["status"]["enum"] == RunStatus.values == [
        "queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled", "lost"]
    assert "cluster" in schemas["Run"]["properties"]["queue"]["enum"]
    metrics = {param["name"]: param["schema"] for param in document["paths"]["/api/runs/{run_id}/metrics/"]["get"]["parameters"]}
    from inflight.api.run_files import MAX_LOG_CHUNK_BYTES
    from inflight.api.views import MAX_RAW_POINTS

    assert metrics["limit"]["maximum"] == MAX_RAW_POINTS
    log_params = {param["name"]: param["schema"] for param in document["paths"]["/api/runs/{run_id}/logs/{name}"]["get"]["parameters"]}
    assert log_params["max_bytes"]["maximum"] == MAX_LOG_CHUNK_BYTES
    # The run config is the typed RunConfig, with its help, in what create takes and a run answers.
    from rl_core.config.run_config import RunConfig, TrainerConfig

    for config in (schemas["RunCreate"]["properties"]["config"], schemas["RunClone"]["properties"]["config"], schemas["Run"]["properties"]["config"]):
        assert set(config["properties"]) == set(RunConfig.model_fields) and config["additionalProperties"] is False
        assert config["properties"]["seed"]["description"] == RunConfig.model_fields["seed"].description
        trainer = config["properties"]["trainer"]
        assert trainer["additionalProperties"] is False
        assert trainer["properties"]["max_steps"]["description"] == TrainerConfig.model_fields["max_steps"].description


def test_cli_status_help_lists_every_status() -> None:
    """`inflight runs --status` names the model's statuses (it listed six of eight: no starting, cancelling)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([str(Path(sys.executable).parent / "inflight"), "runs", "--help"], capture_output=True, text=True, check=True, env=env)
    assert " ".join(result.stdout.split()).count(", ".join(RunStatus.values)) == 1


def test_every_answer_fits_the_served_document(document, owner, owner_api, other_api, staff_api, anonymous_api, tiny_config, dataset_roots,  # noqa: F811
                                               django_capture_on_commit_callbacks, tmp_path) -> None:
    check = Checker(document)
    run = services.create_run(owner, "documented", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(0, "train/loss", 0, 10.0, 0.5), PointIn(0, "success/mean", 0, 10.0, 0.25)])
    line = {"t": 1.0, "step": 2, "benchmark": "aime24", "k": 2, "mean_at_k": 0.5, "pass_at_k": 1.0, "stderr": 0.5, "num_problems": 1, "num_samples": 2, "policy_versions": [2]}
    score = evaluations.ingest_eval(run.pk, line, [{"problem_id": "p", "answer": "4", "samples": ["4", "5"], "extracted": ["4", None], "verdicts": [True, False], "mean": 0.5, "pass": True}])
    rollout = StoredRollout.objects.create(
        run=run, line=0, step=1, seq=1, sample_id="g0-0", group_id="g0", prompt_id="p0", prompt_text="1+1?", problem_text="1+1?",
        completion_text="2", tokens=["2"], token_ids=[17], logprobs=[-0.5], versions=[0], train_logprobs=None, reward=1.0, correct=True,
        advantage=0.5, length=1, min_version=0, max_version=0, versions_spanned=1, max_lag=0, extracted="2", finish_reason="stop", t=1.0,
    )
    Alert.objects.create(run=run, rule="reward_collapse", key="", step=2, t=2.0, message="reward fell", values={"mean": 0.1, "threshold": 0.2})
    logs = run_paths.run_dir(run.pk) / "logs"
    logs.mkdir(parents=True)
    (logs / "supervisor_child.log").write_text("hello\n")
    write_checkpoint(run, 2)
    rid = run.pk

    # Reads, each answered 2xx.
    check(owner_api.get("/api/runs/"), "get", "/api/runs/", 200)
    check(owner_api.get(f"/api/runs/{rid}/"), "get", f"/api/runs/{rid}/", 200)
    check(owner_api.get(f"/api/runs/{rid}/metrics/"), "get", f"/api/runs/{rid}/metrics/", 200)
    for query in ("since_seq=0", "since_seq=0&format=records", "since_seq=0&limit=1&names=train/loss"):
        check(owner_api.get(f"/api/runs/{rid}/metrics/?{query}"), "get", f"/api/runs/{rid}/metrics/", 200)
    check(owner_api.get(f"/api/runs/{rid}/evals/"), "get", f"/api/runs/{rid}/evals/", 200)
    detail = check(owner_api.get(f"/api/evals/{score.pk}/"), "get", f"/api/evals/{score.pk}/", 200)
    assert detail["problems"][0]["pass"] is True
    check(owner_api.get("/api/leaderboard/"), "get", "/api/leaderboard/", 200)
    services.record_heartbeat("w@h", hostname="h", queues=["cpu"], gpus=[{"index": 0, "name": "H100", "memory_total_mb": 80000, "memory_used_mb": 1, "utilization": 5}], cpu_count=2)
    check(owner_api.get("/api/workers/"), "get", "/api/workers/", 200)
    check(staff_api.get("/api/workers/"), "get", "/api/workers/", 200)
    check(owner_api.get(f"/api/runs/{rid}/checkpoints/"), "get", f"/api/runs/{rid}/checkpoints/", 200)
    check(owner_api.get(f"/api/runs/{rid}/checkpoints/2/download/"), "get", f"/api/runs/{rid}/checkpoints/2/download/", 200)
    check(owner_api.get(f"/api/runs/{rid}/logs/"), "get", f"/api/runs/{rid}/logs/", 200)
    check(owner_api.get(f"/api/runs/{rid}/logs/supervisor_child.log?tail=3"), "get", f"/api/runs/{rid}/logs/supervisor_child.log", 200)
    check(owner_api.get(f"/api/runs/{rid}/rollouts/"), "get", f"/api/runs/{rid}/rollouts/", 200)
    check(owner_api.get(f"/api/runs/{rid}/rollouts/{rollout.pk}/"), "get", f"/api/runs/{rid}/rollouts/{rollout.pk}/", 200)
    check(owner_api.get(f"/api/runs/{rid}/rollouts/{rollout.pk}/group/"), "get", f"/api/runs/{rid}/rollouts/{rollout.pk}/group/", 200)
    check(owner_api.get(f"/api/runs/{rid}/alerts/"), "get", f"/api/runs/{rid}/alerts/", 200)
    check(owner_api.get(f"/api/runs/{rid}/export/metrics.csv"), "get", f"/api/runs/{rid}/export/metrics.csv", 200)
    check(owner_api.get(f"/api/runs/{rid}/export/nope.csv"), "get", f"/api/runs/{rid}/export/nope.csv", 404)
    mirrored = mirrored_run(owner, tmp_path).pk
    check(owner_api.get(f"/api/runs/{mirrored}/mirrors/wandb/download/"), "get", f"/api/runs/{mirrored}/mirrors/wandb/download/", 200)
    check(owner_api.get(f"/api/runs/{rid}/mirrors/wandb/download/"), "get", f"/api/runs/{rid}/mirrors/wandb/download/", 404)

    # Writes: create, edit, cancel (answers the whole run), resume, clone, delete.
    with django_capture_on_commit_callbacks(execute=False):
        created = check(owner_api.post("/api/runs/", {"name": "new", "config": tiny_config}, content_type="application/json"), "post", "/api/runs/", 201)
        check(owner_api.patch(f"/api/runs/{created['id']}/", {"tags": ["a"], "note": "n"}, content_type="application/json"), "patch", f"/api/runs/{created['id']}/", 200)
        cancelled = check(owner_api.post(f"/api/runs/{created['id']}/cancel/"), "post", f"/api/runs/{created['id']}/cancel/", 200)
        assert set(cancelled) == set(created) and cancelled["status"] == "cancelled"
        check(owner_api.post(f"/api/runs/{created['id']}/cancel/"), "post", f"/api/runs/{created['id']}/cancel/", 409)
        Run.objects.filter(pk=rid).update(status=RunStatus.FAILED)
        check(owner_api.post(f"/api/runs/{rid}/resume/"), "post", f"/api/runs/{rid}/resume/", 200)
        check(owner_api.post(f"/api/runs/{rid}/clone/", {"name": "c"}, content_type="application/json"), "post", f"/api/runs/{rid}/clone/", 201)
        check(owner_api.delete(f"/api/runs/{created['id']}/"), "delete", f"/api/runs/{created['id']}/", 200)

    # Sweeps: create (its runs queued), list, read; refused whole by a bad grid or the run limit.
    with django_capture_on_commit_callbacks(execute=False):
        sweep = check(owner_api.post("/api/sweeps/", {"name": "lr", "config": tiny_config, "grid": {"trainer.lr": [3e-4]}, "seeds": 2},
                                     content_type="application/json"), "post", "/api/sweeps/", 201)
        assert sweep["run_count"] == 2 and len(sweep["runs"]) == 2 and sweep["statuses"]["queued"] == 2
        refused = check(owner_api.post("/api/sweeps/", {"config": tiny_config, "grid": {"trainer.lr": [-1]}}, content_type="application/json"),
                        "post", "/api/sweeps/", 400)
        assert "trainer.lr" in refused["fields"]
        too_many = check(owner_api.post("/api/sweeps/", {"config": tiny_config, "seeds": 32, "grid": {"trainer.lr": [1e-4, 2e-4, 3e-4]}},
                                        content_type="application/json"), "post", "/api/sweeps/", 400)
        assert "at most 64" in too_many["fields"]["grid"][0]
    check(owner_api.get("/api/sweeps/"), "get", "/api/sweeps/", 200)
    detail = check(owner_api.get(f"/api/sweeps/{sweep['id']}/?target=0.5"), "get", f"/api/sweeps/{sweep['id']}/", 200)
    assert detail["time_to_target"] == {"target": "0.5", "runs": 2, "reached": 0, "wall_s": {"mean": None, "sd": None},
                                        "steps": {"mean": None, "sd": None}, "samples": {"mean": None, "sd": None}}
    check(owner_api.get(f"/api/sweeps/{sweep['id']}/?target=lots"), "get", f"/api/sweeps/{sweep['id']}/", 400)
    check(other_api.get(f"/api/sweeps/{sweep['id']}/"), "get", f"/api/sweeps/{sweep['id']}/", 404)

    # Datasets: upload, register by path, list, read, delete.
    uploaded = check(upload(owner_api, "arith", GOOD), "post", "/api/datasets/upload/", 201)
    (dataset_roots[1] / "shared.jsonl").write_bytes(GOOD)
    check(owner_api.post("/api/datasets/", {"name": "shared", "path": str(dataset_roots[1] / "shared.jsonl")}, content_type="application/json"),
          "post", "/api/datasets/", 201)
    check(owner_api.get("/api/datasets/"), "get", "/api/datasets/", 200)
    check(owner_api.get(f"/api/datasets/{uploaded['id']}/"), "get", f"/api/datasets/{uploaded['id']}/", 200)
    check(other_api.get(f"/api/datasets/{uploaded['id']}/"), "get", f"/api/datasets/{uploaded['id']}/", 404)
    check(owner_api.delete(f"/api/datasets/{uploaded['id']}/"), "delete", f"/api/datasets/{uploaded['id']}/", 200)

    # Error answers have the one documented shape.
    check(anonymous_api.get("/api/runs/"), "get", "/api/runs/", 401)
    check(owner_api.get("/api/runs/?limit=abc"), "get", "/api/runs/", 400)
    check(owner_api.get("/api/runs/?status=exploded"), "get", "/api/runs/", 400)
    check(owner_api.get(f"/api/runs/{rid}/metrics/?since_seq=0&format=xml"), "get", f"/api/runs/{rid}/metrics/", 400)
    check(other_api.get(f"/api/runs/{rid}/"), "get", f"/api/runs/{rid}/", 404)
    check(owner_api.get(f"/api/runs/{rid}/logs/nope.log"), "get", f"/api/runs/{rid}/logs/nope.log", 404)
    check(staff_api.patch(f"/api/runs/{rid}/", {"note": "x"}, content_type="application/json"), "patch", f"/api/runs/{rid}/", 403)
    check(owner_api.patch(f"/api/runs/{rid}/", {"archived": "yes"}, content_type="application/json"), "patch", f"/api/runs/{rid}/", 400)
    refused = check(owner_api.post("/api/runs/", {"config": {"trainer": {"max_steps": -1}}}, content_type="application/json"), "post", "/api/runs/", 400)
    assert "trainer.max_steps" in refused["fields"]
    check(owner_api.post("/api/runs/", "name=x", content_type="application/x-www-form-urlencoded"), "post", "/api/runs/", 415)
    check(owner_api.post(f"/api/runs/{rid}/clone/", {"colour": 1}, content_type="application/json"), "post", f"/api/runs/{rid}/clone/", 400)
    for index in range(settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER + 1):
        response = owner_api.post("/api/runs/", {"name": f"fill{index}", "config": {}}, content_type="application/json")
        if response.status_code == 429:
            check(response, "post", "/api/runs/", 429)
            break
    else:
        raise AssertionError("the active-run limit never answered 429")
    with django_capture_on_commit_callbacks(execute=False):
        over = check(owner_api.post("/api/sweeps/", {"config": tiny_config, "seeds": 2}, content_type="application/json"), "post", "/api/sweeps/", 201)
    assert over["run_count"] == 0 and over["statuses"]["waiting"] == 2  # past the limit: they wait in the sweep

    unanswered = {(path, method) for path, methods in document["paths"].items() for method in methods} - check.answered
    assert unanswered == set(), "a route no call above answered: add one (a new route's answers are checked here)"
