"""The documented API: /api/openapi.json matches the routes the server really has, real answers
fit the documented models, list pagination metadata, named metric points, the wide CSV export.
(The docs page rendering offline in Chromium: test_api_docs_browser.py.)"""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver
from django.urls.resolvers import RoutePattern

from inflight.api import schema
from inflight.runs import evaluations, services
from inflight.runs.models import Run, RunStatus
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db

UNDOCUMENTED = {"/api/openapi.json", "/api/docs/"}  # the schema and its page describe the rest


def _api_routes() -> list[str]:
    """Every route of inflight.api.urls as an OpenAPI path (`<int:run_id>` → `{run_id}`)."""
    from inflight.api import urls

    routes = []
    for pattern in urls.urlpatterns:
        assert isinstance(pattern, URLPattern) and not isinstance(pattern, URLResolver)
        if not isinstance(pattern.pattern, RoutePattern):
            continue  # a regex catch-all (unknown /api/ paths answer a JSON 404) is no endpoint
        route = "/api/" + str(pattern.pattern)
        routes.append(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route))
    return [route for route in routes if route not in UNDOCUMENTED]


def _concrete(route: str) -> str:
    return re.sub(r"\{\w+\}", "1", route)


def test_schema_is_served_without_a_token_and_documents_auth(anonymous_api) -> None:
    response = anonymous_api.get("/api/openapi.json")
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    document = response.json()
    assert document["openapi"].startswith("3.") and document["info"]["title"] == "Inflight API"
    scheme = document["components"]["securitySchemes"]["TokenHeader"]
    assert scheme == {"type": "apiKey", "in": "header", "name": "Authorization"}
    assert document["paths"]["/api/runs/"]["get"]["security"] == [{"TokenHeader": []}]


def test_every_route_is_documented_with_the_methods_it_answers(anonymous_api) -> None:
    """The schema is declared beside hand-written views: this keeps the two in step. Each route's
    methods are read from the server itself (an OPTIONS request answers 405 with `Allow`)."""
    document = anonymous_api.get("/api/openapi.json").json()
    routes = _api_routes()
    assert sorted(document["paths"]) == sorted(routes)
    for route in routes:
        response = anonymous_api.options(_concrete(route))
        assert response.status_code == 405, route
        served = {method.strip().lower() for method in response["Allow"].split(",")}
        assert set(document["paths"][route]) == served, route


def test_docs_page_uses_the_vendored_swagger_ui(anonymous_api) -> None:
    page = anonymous_api.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html and "/static/ninja/swagger-ui.css" in html
    assert "cdn" not in html.lower() and "https://" not in html
    assert '"url": "/api/openapi.json"' in html


def _validated(model: type, data: Any) -> Any:
    return model.model_validate(data)


def test_real_answers_fit_the_documented_models(owner_api, owner, tmp_path) -> None:
    run = services.create_run(owner, "documented", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(0, "train/loss", 0, 10.0, 0.5), PointIn(0, "success/mean", 0, 10.0, 0.25)])
    line = {"t": 1.0, "step": 2, "benchmark": "aime24", "k": 2, "mean_at_k": 0.5, "pass_at_k": 1.0, "stderr": 0.5, "num_problems": 1, "num_samples": 2, "policy_versions": [2]}
    rows = [{"problem_id": "p", "answer": "4", "samples": ["4", "5"], "extracted": ["4", "5"], "verdicts": [True, False], "mean": 0.5, "pass": True}]
    score = evaluations.ingest_eval(run.pk, line, rows)

    _validated(schema.Run, owner_api.get(f"/api/runs/{run.pk}/").json())
    _validated(schema.RunList, owner_api.get("/api/runs/").json())
    rows_page = _validated(schema.MetricPage, owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0").json())
    records_page = _validated(schema.MetricPage, owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0&format=records").json())
    assert isinstance(records_page.points[0], schema.MetricPointRecord) and isinstance(rows_page.points[0], list)
    _validated(schema.MetricSnapshot, owner_api.get(f"/api/runs/{run.pk}/metrics/").json())
    _validated(schema.EvalList, owner_api.get(f"/api/runs/{run.pk}/evals/").json())
    detail = _validated(schema.EvalDetail, owner_api.get(f"/api/evals/{score.pk}/").json())
    assert detail.problems[0].pass_ is True
    _validated(schema.Leaderboard, owner_api.get("/api/leaderboard/").json())
    _validated(schema.Workers, owner_api.get("/api/workers/").json())
    _validated(schema.CheckpointList, owner_api.get(f"/api/runs/{run.pk}/checkpoints/").json())
    _validated(schema.LogList, owner_api.get(f"/api/runs/{run.pk}/logs/").json())
    _validated(schema.AlertList, owner_api.get(f"/api/runs/{run.pk}/alerts/").json())
    _validated(schema.RolloutPage, owner_api.get(f"/api/runs/{run.pk}/rollouts/").json())
    _validated(schema.Error, owner_api.get("/api/runs/?limit=abc").json())


def test_run_list_pages_carry_count_and_links(owner_api, owner, other_user) -> None:
    ids = []
    for i in range(5):  # ended at once: a user may have only 4 active runs
        ids.append(services.create_run(owner, f"r{i}", {}).pk)
        Run.objects.filter(pk=ids[-1]).update(status=RunStatus.CANCELLED)
    services.create_run(other_user, "not mine", {})
    first = owner_api.get("/api/runs/?limit=2&q=r").json()
    assert first["count"] == 5 and first["offset"] == 0 and first["limit"] == 2 and first["previous"] is None
    assert [run["id"] for run in first["runs"]] == ids[::-1][:2]
    assert first["next"] == "http://testserver/api/runs/?limit=2&q=r&offset=2"
    seen = [run["id"] for run in first["runs"]]
    page = first
    while page["next"]:
        page = owner_api.get(page["next"]).json()
        seen += [run["id"] for run in page["runs"]]
    assert seen == ids[::-1] and page["offset"] == 4 and page["previous"].endswith("offset=2")
    assert owner_api.get("/api/runs/?offset=-1").status_code == 400
    assert owner_api.get("/api/runs/?offset=99").json()["runs"] == []


def test_metric_points_have_named_fields_on_request(owner_api, owner) -> None:
    run = services.create_run(owner, "named", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(0, "train/loss", 3, 12.5, 0.75)])
    rows = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0").json()
    assert rows["columns"] == ["name", "step", "t", "value"] and rows["points"] == [["train/loss", 3, 12.5, 0.75]]
    records = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0&format=records").json()
    assert records["points"] == [{"name": "train/loss", "step": 3, "t": 12.5, "value": 0.75}]
    bad = owner_api.get(f"/api/runs/{run.pk}/metrics/?since_seq=0&format=xml")
    assert bad.status_code == 400 and "'format'" in bad.json()["error"]


def test_wide_csv_has_one_column_per_metric(owner_api, other_api, owner) -> None:
    run = services.create_run(owner, "wide", {})
    live_ingest.ingest_metrics(run.pk, [
        PointIn(0, "train/loss", 1, 10.0, 0.5), PointIn(0, "train/reward_mean", 1, 10.0, 0.25),
        PointIn(1, "success/heldout", 1, 11.0, 0.75),
        PointIn(2, "train/loss", 2, 12.0, 0.4), PointIn(2, "train/reward_mean", 2, 12.0, 0.5),
    ])
    response = owner_api.get(f"/api/runs/{run.pk}/export/metrics_wide.csv")
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    assert f'filename="run-{run.pk}-metrics_wide.csv"' in response["Content-Disposition"]
    table = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    # One row per step (issue 33): step 1's training line and its held-out line are one row.
    assert table == [
        ["step", "t", "success/heldout", "train/loss", "train/reward_mean"],
        ["1", "11.0", "0.75", "0.5", "0.25"],
        ["2", "12.0", "", "0.4", "0.5"],
    ]
    long = b"".join(owner_api.get(f"/api/runs/{run.pk}/export/metrics.csv").streaming_content).decode().splitlines()
    assert long[0] == "step,t,name,value,line" and len(long) == 6  # the long form is unchanged
    assert other_api.get(f"/api/runs/{run.pk}/export/metrics_wide.csv").status_code == 404
