"""Pages against the real embedded PostgreSQL: the generated create form, run page, stop, compare, leaderboard, workers.

Runs are created through the real services; Celery dispatch happens on commit, which
the per-test transaction never reaches, so no worker is involved here (the browser
test runs the whole path).
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from inflight.runs import evaluations, services
from inflight.runs.models import Run, RunStatus
from inflight.live.ingest import PointIn
from inflight.web.config_form import build_sections, iter_fields
from inflight.web.views import MAX_COMPARED_RUNS
from inflight.live import ingest as live_ingest
from rl_core.config.run_config import RunConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_client(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def _form_post(values: dict[str, Any] | None = None, **overrides: str) -> dict[str, Any]:
    """What a browser posts for the create form filled with `values` (defaults) plus overrides."""
    top, sections, _ = build_sections(values)
    post: dict[str, Any] = {"mode": "form"}
    for field in [*top, *iter_fields(sections)]:
        if field.kind == "bool":
            if field.value:
                post[field.path] = "on"
        else:
            post[field.path] = field.value
    for path, value in overrides.items():
        path = path.replace("__", ".")
        if value is None:
            post.pop(path, None)
        else:
            post[path] = value
    return post


def _leaf_fields(model: type, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            out += _leaf_fields(annotation, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", info.description or ""))
    return out


def test_create_form_has_every_config_field_with_its_help_text(owner_client: Client) -> None:
    response = owner_client.get(reverse("web:run_create"))
    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    leaves = _leaf_fields(RunConfig)
    assert len(leaves) > 50
    for path, description in leaves:
        assert f'name="{path}"' in page, path
        assert description and description in page, path
    # acceleration toggles are switches
    for toggle in ("accelerations.histospec.enabled", "accelerations.histopipe.enabled", "accelerations.tail_batching.enabled"):
        assert re.search(rf'<label class="switch">\s*<input type="checkbox" name="{re.escape(toggle)}"', page), toggle
    assert "csrfmiddlewaretoken" in page


def test_create_form_launches_a_run_with_the_posted_values(owner_client: Client, owner) -> None:
    post = _form_post(
        name="from the form",
        trainer__max_steps="3",
        trainer__zero_stage="2",
        **{"accelerations.histospec.enabled": "on", "task.operators": '["+", "*"]', "eval.max_problems": ""},
    )
    response = owner_client.post(reverse("web:run_create"), post)
    assert response.status_code == 302, response.content.decode()[:2000]
    run = Run.objects.get(owner=owner)
    assert response["Location"] == reverse("web:run_detail", args=[run.pk])
    assert run.name == "from the form" and run.status == RunStatus.QUEUED
    assert run.config["trainer"]["max_steps"] == 3
    assert run.config["trainer"]["zero_stage"] == 2
    assert run.config["accelerations"]["histospec"]["enabled"] is True
    assert run.config["accelerations"]["tail_batching"]["enabled"] is False
    assert run.config["task"]["operators"] == ["+", "*"]
    assert run.config["eval"]["max_problems"] is None


def test_bad_form_input_is_shown_next_to_the_field_and_creates_nothing(owner_client: Client) -> None:
    post = _form_post(trainer__lr="fast", trainer__max_steps="0", **{"task.operators": "[unclosed", "sampling.top_p": "1.5"})
    response = owner_client.post(reverse("web:run_create"), post)
    assert response.status_code == 400
    page = html.unescape(response.content.decode())
    assert Run.objects.count() == 0
    for path in ("trainer.lr", "trainer.max_steps", "task.operators", "sampling.top_p"):
        assert f'data-error-for="{path}"' in page, path
    # the user's text is shown back as typed
    assert 'value="fast"' in page
    assert "valid number" in page and "greater than or equal to 1" in page and "not valid JSON/YAML" in page


def test_section_level_errors_land_on_the_section(owner_client: Client) -> None:
    post = _form_post(**{"task.kind": "math_jsonl", "task.train_path": ""})
    response = owner_client.post(reverse("web:run_create"), post)
    assert response.status_code == 400
    assert 'data-error-for="task"' in response.content.decode()
    assert "train_path is required" in response.content.decode()


def test_yaml_editor_launches_and_reports_bad_yaml(owner_client: Client, owner, tiny_config) -> None:
    url = reverse("web:run_create")
    response = owner_client.post(url, {"mode": "yaml", "config_yaml": yaml.safe_dump(tiny_config)})
    assert response.status_code == 302
    assert Run.objects.get(owner=owner).config["trainer"]["max_steps"] == 2
    for text, expected in (
        ("trainer: {max_steps: [", "not valid YAML"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("trainer:\n  max_stepz: 3\n", "trainer.max_stepz"),
    ):
        response = owner_client.post(url, {"mode": "yaml", "config_yaml": text})
        assert response.status_code == 400, text
        assert expected in html.unescape(response.content.decode())
    assert Run.objects.count() == 1


def test_presets(owner_client: Client) -> None:
    response = owner_client.get(reverse("web:run_create") + "?preset=nope")
    assert response.status_code == 400
    assert "unknown preset" in response.content.decode()
    tiny = owner_client.get(reverse("web:run_create") + "?preset=tiny-cpu")
    gpu = owner_client.get(reverse("web:run_create") + "?preset=qwen2.5-math-1.5b-math")
    from inflight.web.config_form import REPO_ROOT

    if (REPO_ROOT / "examples" / "qwen2.5-math-1.5b-math.yaml").is_file():
        page = gpu.content.decode()
        assert gpu.status_code == 200
        assert re.search(r'<option value="vllm" selected>', page) and re.search(r'<option value="deepspeed" selected>', page)
    if (REPO_ROOT / "examples" / "tiny-cpu.yaml").is_file():
        assert tiny.status_code == 200


def _run_with_metrics(owner, name: str = "r", **config: Any) -> Run:
    run = services.create_run(owner, name, {"name": name, **config})
    live_ingest.ingest_metrics(run.pk, [PointIn(line=i, name="reward/mean", step=i, t=1000.0 + i, value=i / 10) for i in range(5)])
    return run


def test_run_page_shows_status_config_charts_and_stop(owner_client: Client, owner) -> None:
    run = _run_with_metrics(owner, "page-run", trainer={"max_steps": 7})
    page = owner_client.get(reverse("web:run_detail", args=[run.pk])).content.decode()
    assert 'id="stop-form"' in page and 'class="inline"' in page.split('id="stop-form"')[1][:40]
    assert "max_steps: 7" in page
    assert "vendor/plotly/plotly.min.js" in page and f"/ws/runs/{run.pk}/" in page
    snapshot = owner_client.get(reverse("web:run_snapshot", args=[run.pk])).json()
    assert snapshot["seq"] == 1 and snapshot["series"]["reward/mean"]["last"] == [0.0, 0.1, 0.2, 0.3, 0.4]

    response = owner_client.post(reverse("web:run_stop", args=[run.pk]))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED  # a queued run is cancelled at once
    page = owner_client.get(reverse("web:run_detail", args=[run.pk])).content.decode()
    assert "inline hidden" in page  # no stop button on a finished run
    again = owner_client.post(reverse("web:run_stop", args=[run.pk]), follow=True)
    assert again.status_code == 200 and "Nothing to stop" in again.content.decode()


def test_stop_needs_post_and_csrf(owner) -> None:
    run = services.create_run(owner, "r", {})
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.get(reverse("web:run_stop", args=[run.pk])).status_code == 405
    assert client.post(reverse("web:run_stop", args=[run.pk])).status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def _eval(run: Run, step: int, solved: dict[str, bool]) -> None:
    rows = [{"problem_id": pid, "answer": "1", "samples": ["x"], "extracted": ["1" if ok else "2"], "verdicts": [ok], "mean": float(ok), "pass": ok} for pid, ok in solved.items()]
    line = {"benchmark": "math500", "step": step, "k": 1, "mean_at_k": sum(solved.values()) / len(solved), "pass_at_k": 0.5, "num_problems": len(solved), "num_samples": len(solved)}
    evaluations.ingest_eval(run.pk, line, rows)


def test_run_page_lists_problems_that_flipped_since_the_previous_eval(owner_client: Client, owner) -> None:
    run = services.create_run(owner, "r", {})
    _eval(run, 2, {"p-keep": True, "p-gain": False, "p-loss": True})
    _eval(run, 4, {"p-keep": True, "p-gain": True, "p-loss": False})
    page = owner_client.get(reverse("web:run_detail", args=[run.pk])).content.decode()
    assert "▲ 1 solved" in page and "▼ 1 lost" in page
    gain_row = page[page.index(">p-gain<"):][:600]
    loss_row = page[page.index(">p-loss<"):][:600]
    keep_row = page[page.index(">p-keep<"):][:600]
    assert "now solved" in gain_row and "no longer solved" in loss_row
    assert "solved" not in keep_row.split("</tr>")[0].split("<td>")[-1]


def test_compare_shows_only_differing_config_fields(owner_client: Client, owner, other_user) -> None:
    a = services.create_run(owner, "a", {"trainer": {"lr": 0.001}})
    b = services.create_run(owner, "b", {"trainer": {"lr": 0.002}, "accelerations": {"histospec": {"enabled": True}}})
    page = owner_client.get(reverse("web:compare") + f"?runs={a.pk}&runs={b.pk}").content.decode()
    diff = page[page.index("Config differences"):]
    assert "trainer.lr" in diff and "accelerations.histospec.enabled" in diff and "name" in diff
    assert "trainer.max_steps" not in diff and "sampling.temperature" not in diff
    assert owner_client.get(reverse("web:compare") + "?runs=x").status_code == 400
    too_many = ",".join(str(i) for i in range(1, MAX_COMPARED_RUNS + 2))
    assert owner_client.get(reverse("web:compare") + "?runs=" + too_many).status_code == 400
    theirs = services.create_run(other_user, "t", {})
    assert owner_client.get(reverse("web:compare") + f"?runs={a.pk},{theirs.pk}").status_code == 404
    assert owner_client.get(reverse("web:compare")).status_code == 200  # the picker alone


def test_the_compare_loads_every_runs_snapshot_in_one_request_equal_to_each_runs_own(owner_client: Client, owner, other_user) -> None:
    runs = [_run_with_metrics(owner, f"c{i}") for i in range(3)]
    live_ingest.ingest_metrics(runs[1].pk, [PointIn(line=9, name="train/loss", step=1, t=2000.0, value=0.5)])
    url = reverse("web:compare_snapshots")
    order = [runs[2].pk, runs[0].pk, runs[1].pk]
    for query in ({}, {"names": "reward/mean"}, {"names": "train/loss,reward/mean", "min_shift": "2"}):
        answer = owner_client.get(url, {"runs": ",".join(map(str, order)), **query})
        assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
        own = [owner_client.get(reverse("web:run_snapshot", args=[run_id]), query).json() for run_id in order]
        assert answer.json()["snapshots"] == own  # in the asked order, each what its own snapshot.json says
    page = owner_client.get(reverse("web:compare") + f"?runs={runs[0].pk},{runs[1].pk}").content.decode()
    assert f'"snapshots_url": "{url}"' in page  # compare.js's first load asks there

    theirs = services.create_run(other_user, "theirs", {})
    refused = owner_client.get(url, {"runs": f"{runs[0].pk},{theirs.pk}"})
    assert refused.status_code == 404 and f"#{theirs.pk}" in refused.json()["error"]
    too_many = ",".join(str(i) for i in range(1, MAX_COMPARED_RUNS + 2))
    for bad, field in ((too_many, "runs"), ("x", "runs"), ("", "runs")):
        answer = owner_client.get(url, {"runs": bad})
        assert answer.status_code == 400 and answer.json()["error"].startswith(field), answer.json()
    answer = owner_client.get(url, {"runs": str(runs[0].pk), "min_shift": "-1"})
    assert answer.status_code == 400 and answer.json()["error"].startswith("min_shift")
    assert Client().get(url, {"runs": str(runs[0].pk)}).status_code == 401  # signed out: no series


def test_leaderboard_sorts_and_refuses_unknown_keys(owner_client: Client, owner) -> None:
    low = _run_with_metrics(owner, "low")
    high = services.create_run(owner, "high", {})
    live_ingest.ingest_metrics(high.pk, [PointIn(line=0, name="success/mean", step=1, t=1.0, value=0.9)])
    live_ingest.ingest_metrics(low.pk, [PointIn(line=10, name="success/mean", step=1, t=1.0, value=0.2)])
    page = owner_client.get(reverse("web:leaderboard") + "?sort=-success_best").content.decode()
    assert page.index(">high<") < page.index(">low<")
    page = owner_client.get(reverse("web:leaderboard") + "?sort=success_best").content.decode()
    assert page.index(">low<") < page.index(">high<")
    bad = owner_client.get(reverse("web:leaderboard") + "?sort=bogus")
    assert bad.status_code == 400 and "unknown sort key" in bad.content.decode()


def test_workers_page_and_runs_status(owner_client: Client, owner, staff_user) -> None:
    services.record_heartbeat("celery@box", hostname="box", queues=["cpu", "gpu"], gpus=[{"index": 0, "name": "H100", "memory_total_mb": 80000, "memory_used_mb": 1000, "utilization": 37}], cpu_count=16)
    page = owner_client.get(reverse("web:workers")).content.decode()
    assert "GPU0 H100" in page and "80000 MB" in page and "alive" in page
    assert "celery@box" not in page and "box" not in page.split("<main")[1] and "37%" not in page  # staff only
    staff = Client()
    staff.force_login(staff_user)
    staff_page = staff.get(reverse("web:workers")).content.decode()
    assert "celery@box" in staff_page and "37%" in staff_page
    run = services.create_run(owner, "r", {})
    rows = owner_client.get(reverse("web:runs_status") + f"?ids={run.pk},999999").json()["runs"]
    assert [row["id"] for row in rows] == [run.pk] and rows[0]["status"] == "queued"
    assert owner_client.get(reverse("web:runs_status") + "?ids=1,x").status_code == 400
    listing = owner_client.get(reverse("web:run_list")).content.decode()
    assert f'data-status-of="{run.pk}"' in listing


def test_snapshot_endpoint_refuses_bad_parameters(owner_client: Client, owner) -> None:
    run = _run_with_metrics(owner)
    url = reverse("web:run_snapshot", args=[run.pk])
    assert owner_client.get(url + "?min_shift=abc").status_code == 400
    assert owner_client.get(url + "?min_shift=99").status_code == 400
    coarse = owner_client.get(url + "?min_shift=2").json()
    assert coarse["width"] == 4 and coarse["series"]["reward/mean"]["b"] == [0, 1]
    assert owner_client.get(url + "?names=nothing").json()["series"] == {}
    empty = services.create_run(owner, "empty", {})
    assert owner_client.get(reverse("web:run_snapshot", args=[empty.pk])).json() == {
        "run": empty.pk, "seq": 0, "shift": 0, "width": 1, "max_step": None, "series": {}
    }


def test_out_of_range_ids_are_not_found_rather_than_errors(owner_client: Client) -> None:
    huge = "9" * 25
    assert owner_client.get(f"/runs/{huge}/").status_code == 404
    assert owner_client.get(f"/runs/{huge}/snapshot.json").status_code == 404
    assert owner_client.post(f"/runs/{huge}/stop/").status_code == 404
    assert owner_client.get(reverse("web:runs_status") + f"?ids={huge}").status_code == 400
    assert owner_client.get(reverse("web:compare") + f"?runs={huge}").status_code == 400
    assert owner_client.get(reverse("web:compare") + "?runs=-3").status_code == 400


def test_a_preset_that_no_longer_matches_the_schema_shows_its_errors(owner_client: Client, monkeypatch, tmp_path) -> None:
    from inflight.web import config_form

    stale = tmp_path / "examples" / "tiny-cpu.yaml"
    stale.parent.mkdir()
    stale.write_text("trainer:\n  max_steps: 0\n  renamed_field: 1\n")
    monkeypatch.setattr(config_form, "REPO_ROOT", tmp_path)
    response = owner_client.get(reverse("web:run_create") + "?preset=tiny-cpu")
    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    assert 'data-error-for="trainer.max_steps"' in page and "trainer.renamed_field" in page


def test_pages_scripts_take_the_terminal_statuses_from_the_run_model(owner_client: Client, repo_root) -> None:
    import json
    from pathlib import Path

    from inflight.runs.statuses import TERMINAL_STATUSES

    page = owner_client.get(reverse("web:run_list")).content.decode()
    found = re.search(r'<script id="terminal-statuses" type="application/json">(.*?)</script>', page)
    assert found and sorted(json.loads(found.group(1))) == sorted(TERMINAL_STATUSES)
    assert "inflight/run_status.js" in page
    # One owner: no page script spells the statuses out again.
    for script in sorted(Path(repo_root, "static", "inflight").glob("*.js")):
        assert '"cancelled"' not in script.read_text(), script.name
