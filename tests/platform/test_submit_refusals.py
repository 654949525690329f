"""Bad submissions found by the malformed-request sweep and the first-hour review (issues 25, 26),
each refused at submit with a clear 4xx that names the field, never a 500 or a run that fails
at start or sits for days:

- an unknown `eval.benchmarks` / `eval.k` name (the config's one validator asks the evaluator's registry);
- sizes no worker can hold or the task cannot fill (`trainer.samples_per_step` = 100,000,000, ...);
- a multipart body on the JSON API (415 in the API's error shape, was a 500);
- an unknown /api/ path (JSON 404 in the API's error shape, was an HTML page);
and the create form opens with the demo's values (examples/tiny-cpu.yaml).
Django's test client on the real database; tests/platform/test_security.py does the same through Daphne.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inflight.runs.models import Run

pytestmark = pytest.mark.django_db

REPO_ROOT = Path(__file__).resolve().parents[2]


def submit(client, config: dict[str, Any]):
    return client.post("/api/runs/", json.dumps({"name": "probe", "config": config}), content_type="application/json")


def refused_fields(response) -> dict[str, list[str]]:
    assert response.status_code == 400, response.content
    return response.json()["fields"]


def test_an_unknown_benchmark_is_refused_at_submit(owner_api) -> None:
    fields = refused_fields(submit(owner_api, {"eval": {"benchmarks": ["math500", "math-500"]}}))
    assert list(fields) == ["eval.benchmarks"]
    assert "unknown benchmark 'math-500'" in fields["eval.benchmarks"][0] and "math500" in fields["eval.benchmarks"][0]
    fields = refused_fields(submit(owner_api, {"eval": {"benchmarks": ["aime24"], "k": {"aime": 8}}}))
    assert list(fields) == ["eval.k"] and "unknown benchmark 'aime'" in fields["eval.k"][0]
    assert Run.objects.count() == 0
    accepted = submit(owner_api, {"eval": {"benchmarks": ["aime24", "synthetic"], "k": {"aime24": 8}}})
    assert accepted.status_code == 201, accepted.content


def test_a_custom_env_outside_the_operators_env_roots_is_refused_at_submit(owner_api, monkeypatch, tmp_path) -> None:
    from rl_core.envs.environments import ENV_ROOTS_VARIABLE

    root = Path(__file__).resolve().parents[2] / "examples" / "custom_env"
    custom = {"name": "custom", "class_path": "integer_answer_env:IntegerAnswerEnvironment"}
    monkeypatch.delenv(ENV_ROOTS_VARIABLE, raising=False)
    fields = refused_fields(submit(owner_api, {"env": custom}))
    assert list(fields) == ["env.class_path"] and "INFLIGHT_ENV_ROOTS is not set" in fields["env.class_path"][0]
    monkeypatch.setenv(ENV_ROOTS_VARIABLE, str(tmp_path))
    fields = refused_fields(submit(owner_api, {"env": custom}))
    assert "not in the allowed env folders" in fields["env.class_path"][0]
    assert Run.objects.count() == 0
    monkeypatch.setenv(ENV_ROOTS_VARIABLE, str(root))
    accepted = submit(owner_api, {"env": custom})
    assert accepted.status_code == 201, accepted.content


@pytest.mark.parametrize(
    ("config", "field", "needle"),
    [
        ({"trainer": {"samples_per_step": 100_000_000}}, "trainer.samples_per_step", "INFLIGHT_MAX_SAMPLES_PER_STEP"),
        ({"actor": {"groups_in_flight": 10_000, "group_size": 16}}, "actor.groups_in_flight", "160000 sequences in flight"),
        ({"inference": {"max_batch_size": 10**9}}, "inference.max_batch_size", "INFLIGHT_MAX_SAMPLES_PER_STEP"),
        ({"task": {"heldout_size": 600}, "eval": {"heldout_k": 64}}, "task.heldout_size", "38400 sequences per evaluation"),
        ({"task": {"train_size": 10**9, "max_operand": 10**6}}, "task.train_size", "INFLIGHT_MAX_TASK_PROBLEMS"),
        # 64 samples of 8 attempts need 8 prompts; the task was given 4.
        ({"task": {"train_size": 4}, "trainer": {"samples_per_step": 64}}, "trainer.samples_per_step", "the task has 4 training prompts"),
        # 21 x 21 operand pairs x 2 operators = 882 problems: 900 held out leave none to train on.
        ({"task": {"heldout_size": 900}, "eval": {"heldout_k": 1}}, "task.heldout_size", "leave no training problem"),
    ],
)
def test_sizes_no_worker_can_hold_or_the_task_cannot_fill_are_refused(owner_api, config, field, needle) -> None:
    fields = refused_fields(submit(owner_api, config))
    assert field in fields and needle in " ".join(fields[field]), fields
    assert Run.objects.count() == 0


def test_the_demo_config_and_the_limits_edge_are_accepted(owner_api, settings) -> None:
    demo = yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text())
    assert submit(owner_api, demo).status_code == 201
    edge = {"trainer": {"samples_per_step": settings.INFLIGHT_MAX_SAMPLES_PER_STEP}, "actor": {"group_size": 16},
            "task": {"max_operand": 1000, "train_size": settings.INFLIGHT_MAX_SAMPLES_PER_STEP // 16}}
    assert submit(owner_api, edge).status_code == 201, submit(owner_api, edge).content
    settings.INFLIGHT_MAX_SAMPLES_PER_STEP = 32  # the operator's setting is what counts
    assert "trainer.samples_per_step" in refused_fields(submit(owner_api, demo))


def test_a_multipart_body_is_refused_as_not_json(owner_api) -> None:
    # The test client sends a dict as multipart/form-data: the input guard has read it, the view
    # then asked for the raw body (RawPostDataException, a 500 before).
    response = owner_api.post("/api/runs/", {"name": "x", "config": ("c.yaml", b"name: x\n")})
    assert response.status_code == 415 and response["Content-Type"] == "application/json", response.content
    assert "send JSON" in response.json()["error"] and "multipart/form-data" in response.json()["error"]
    assert Run.objects.count() == 0


def test_unknown_api_paths_answer_json_in_the_api_error_shape(owner_api, anonymous_api) -> None:
    for client in (owner_api, anonymous_api):
        for path in ("/api/nope/", "/api/runs/1/nope/", "/api/v2/runs/", "/api/runs/abc/"):
            response = client.get(path)
            assert response.status_code == 404 and response["Content-Type"] == "application/json", (path, response.content[:200])
            assert response.json() == {"error": f"no API endpoint at {path}"}
        # APPEND_SLASH still leads a slash-less API path to its endpoint.
        response = client.get("/api/runs")
        assert response.status_code == 301 and response["Location"] == "/api/runs/"
    # Pages keep their HTML 404.
    assert "text/html" in anonymous_api.get("/no/such/page/")["Content-Type"]


def test_favicon_is_served(anonymous_api) -> None:
    response = anonymous_api.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"] == "/static/inflight/favicon.ico"
    assert (REPO_ROOT / "static" / "inflight" / "favicon.ico").read_bytes()[:4] == b"\x00\x00\x01\x00"  # an ICO file
    page = anonymous_api.get("/accounts/login/").content.decode()
    assert '<link rel="icon" href="/static/inflight/favicon.ico"' in page


def test_the_create_form_opens_with_the_demo_values(owner_web) -> None:
    from rl_core.config.files import with_run_defaults

    # The demo's own settings over a run's defaults (the YAML no longer restates those: issue 33).
    demo = with_run_defaults(yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text()))
    page = owner_web.get("/runs/new/").content.decode()
    for path, value in (("trainer.samples_per_step", demo["trainer"]["samples_per_step"]), ("trainer.max_steps", demo["trainer"]["max_steps"]),
                        ("trainer.warmup_steps", demo["trainer"]["warmup_steps"]), ("actor.max_lag", demo["actor"]["max_lag"]),
                        ("max_wall_time_s", demo["max_wall_time_s"]), ("name", demo["name"])):
        assert _input_value(page, path) in (str(value), str(float(value)) if not isinstance(value, str) else value), path


def _input_value(page: str, name: str) -> str | None:
    import re

    tag = re.search(rf'<input[^>]*name="{re.escape(name)}"[^>]*>', page)
    if tag is None:
        return None
    value = re.search(r'value="([^"]*)"', tag.group(0))
    return value.group(1) if value else None
