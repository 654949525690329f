"""API actions on runs (clone/fork, resume, checkpoints, edit, delete) and the filtered run list.

    GET    /api/runs/                 ?status=&tag=&q=&owner=&archived=0|1|all&sort=-created&limit=&offset=
                                      → {"runs": [...], "count", "limit", "offset", "next", "previous"}
    POST   /api/runs/                 {"name", "config"} → 201 new run
    GET    /api/runs/<id>/            → run (with parent, parent_step, tags, note, archived, resume_count)
    PATCH  /api/runs/<id>/            {"tags": [..], "note": str, "archived": bool}   (owner)
    DELETE /api/runs/<id>/            → {"deleted": id}; rows now, the run directory by a worker   (owner)
    POST   /api/runs/<id>/clone/      {"name", "config": {overrides}, "from_step": int?} → 201 new run
    POST   /api/runs/<id>/resume/     → the same run, queued again from its latest checkpoint
    GET    /api/runs/<id>/checkpoints/ → {"checkpoints": [{"step", "t", "path", "evals", "latest"}]}

Runs the user may not see answer 404; refusals by state answer 409, bad input 400.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from inflight.api import views as api_views
from inflight.api.auth import api_view, int_param, page_links, read_json_body
from inflight.api.errors import ApiError, json_response
from inflight.runs import actions, selectors, services
from inflight.runs.models import Run, RunStatus
from inflight.runs.run_filters import BadFilter, RunFilters, filter_runs


def run_full_json(run: Run) -> dict[str, Any]:
    return {
        **api_views.run_json(run),
        "parent": run.parent_id,
        "parent_step": run.parent_step,
        "tags": run.tags or [],
        "note": run.note,
        "archived": run.archived,
        "resume_count": run.resume_count,
    }


def _create_run(request: HttpRequest) -> Any:
    body = read_json_body(request)
    unknown = sorted(set(body) - {"name", "config"})
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}; send 'name' and 'config'")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise ApiError(400, "'name' must be a string", fields={"name": ["must be a string"]})
    try:
        run = services.create_run(request.user, name, body.get("config", {}))
    except services.RunLimitExceeded as exc:
        raise ApiError(429, str(exc), fields=exc.errors) from exc
    except services.InvalidRunConfig as exc:
        raise ApiError(400, f"invalid config: {exc}", fields=exc.errors) from exc
    return _queued_or_503(run, 201)


def _queued_or_503(run: Run, status: int) -> dict[str, Any] | Any:
    # Queued after commit: if the broker refused it, the run is already `failed`. Say so.
    run.refresh_from_db()
    if run.status == RunStatus.FAILED:
        raise ApiError(503, f"the run could not be queued: {run.error}", run=run_full_json(run))
    return json_response(run_full_json(run), status=status)


@api_view("GET", "POST")
def runs(request: HttpRequest) -> Any:
    if request.method == "POST":
        return _create_run(request)
    try:
        filters = RunFilters.from_query(request.GET)
    except BadFilter as exc:
        raise ApiError(400, str(exc)) from exc
    limit = int_param(request, "limit", default=200, minimum=1, maximum=1000)
    offset = int_param(request, "offset", default=0)
    queryset = filter_runs(selectors.runs_visible_to(request.user), filters, request.user).select_related("owner")
    count = queryset.count()
    return {"runs": [run_full_json(run) for run in queryset[offset:offset + limit]], **page_links(request, count, offset, limit)}


@api_view("GET", "PATCH", "DELETE")
def run_detail(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    if request.method == "GET":
        return run_full_json(run)
    if request.method == "DELETE":
        try:
            actions.delete_run(run, request.user)
        except actions.ActionRefused as exc:
            raise ApiError(409, f"cannot delete: {exc}") from exc
        return {"deleted": run_id}
    try:
        return run_full_json(actions.update_run(run, request.user, read_json_body(request)))
    except actions.BadActionInput as exc:
        raise ApiError(400, str(exc), fields=exc.errors) from exc


@api_view("POST")
def run_clone(request: HttpRequest, run_id: int) -> Any:
    source = selectors.visible_run_or_404(request.user, run_id)
    body = read_json_body(request)
    unknown = sorted(set(body) - {"name", "config", "from_step"})
    if unknown:
        raise ApiError(400, f"unknown field(s): {', '.join(unknown)}; send 'name', 'config' (overrides) and optionally 'from_step'")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise ApiError(400, "'name' must be a string", fields={"name": ["must be a string"]})
    try:
        run = actions.clone_run(request.user, source, name, body.get("config"), body.get("from_step"))
    except actions.BadActionInput as exc:
        raise ApiError(400, str(exc), fields=exc.errors) from exc
    except services.RunLimitExceeded as exc:
        raise ApiError(429, str(exc), fields=exc.errors) from exc
    except services.InvalidRunConfig as exc:
        raise ApiError(400, f"invalid config: {exc}", fields=exc.errors) from exc
    return _queued_or_503(run, 201)


@api_view("POST")
def run_resume(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    try:
        run = actions.resume_run(run, request.user)
    except actions.ActionRefused as exc:
        raise ApiError(409, f"cannot resume: {exc}") from exc
    except services.RunLimitExceeded as exc:
        raise ApiError(429, str(exc), fields=exc.errors) from exc
    return _queued_or_503(run, 200)


@api_view("GET")
def run_checkpoints(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    return {"run": run.pk, "checkpoints": [info.to_json() for info in actions.run_checkpoints(run)]}
