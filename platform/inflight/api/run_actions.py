"""Runs through the API: the filtered list, create, read, edit, delete, clone/fork, resume, cancel
and the checkpoints a run can be resumed or forked from.

Runs the user may not see answer 404; refusals by state answer 409, bad input 400 (naming the
field), a user over the active-run limit 429, a run the broker refused 503 (with the run).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Body, Query, Schema
from ninja.responses import Status
from pydantic import Field

from inflight.api import schema
from inflight.api.auth import ApiRouter, QueryInt, page_links
from inflight.api.errors import ApiError
from inflight.runs import actions, selectors, services
from inflight.runs.models import Run, RunStatus
from inflight.runs.run_filters import RUN_SORT_KEYS, BadFilter, RunFilters, filter_runs
from inflight.runs.safe_input import MAX_INT

router = ApiRouter(tags=["runs"])

# Runs per page of GET /api/runs/ when no `limit` is given, and the most one page may hold.
RUN_LIST_PAGE = 200
MAX_RUN_LIST_PAGE = 1000
QUEUE_ERRORS: dict[int, type] = {429: schema.Error, 503: schema.Error}


class RunListFilters(Schema):
    """The run list's filters (parsed by runs.run_filters, shared with the pages)."""

    status: str | None = Field(None, description="One of: " + ", ".join(RunStatus.values) + ".")
    tag: str | None = None
    q: str | None = Field(None, description="Text in the name.")
    owner: str | None = Field(None, description="Username (staff see everyone's runs).")
    archived: str | None = Field(None, description="0 (default): archived runs hidden; 1: only archived; all.")


def run_filters(request: HttpRequest, *, sort: bool) -> RunFilters:
    # The declared parameters document the filters; runs.run_filters reads them (one parser for
    # the pages and the API), with the run list's messages.
    try:
        return RunFilters.from_query(request.GET, sort=sort)
    except BadFilter as exc:
        raise ApiError(400, str(exc)) from exc


@router.get("/runs/", response={200: schema.RunList, **schema.ERRORS}, url_name="runs", summary="List runs, newest first, paged")
def list_runs(
    request: HttpRequest, filters: Query[RunListFilters],
    sort: str = Query("-created", description="A column, `-` for descending: " + ", ".join(RUN_SORT_KEYS) + "."),
    limit: QueryInt = Query(RUN_LIST_PAGE, ge=1, le=MAX_RUN_LIST_PAGE), offset: QueryInt = Query(0, ge=0, le=MAX_INT),
) -> Any:
    parsed = run_filters(request, sort=True)
    queryset = filter_runs(selectors.runs_visible_to(request.user), parsed, request.user).select_related("owner")
    count = queryset.count()
    return {"runs": list(queryset[offset:offset + limit]), **page_links(request, count, offset, limit)}


def _queued(run: Run, status: int) -> Status:
    # Queued after commit: if the broker refused it, the run is already `failed`. Say so.
    run.refresh_from_db()
    if run.status == RunStatus.FAILED:
        raise ApiError(503, f"the run could not be queued: {run.error}", run=schema.run_answer(run))
    return Status(status, run)


@router.post("/runs/", response={201: schema.Run, 415: schema.Error, **schema.ERRORS, **QUEUE_ERRORS}, url_name="runs", summary="Create and queue a run")
def create_run(request: HttpRequest, body: schema.RunCreate = Body(schema.RunCreate())) -> Any:
    try:
        run = services.create_run(request.user, body.name, body.config)
    except services.RunLimitExceeded as exc:
        raise ApiError(429, str(exc), fields=exc.errors) from exc
    except services.InvalidRunConfig as exc:
        raise ApiError(400, f"invalid config: {exc}", fields=exc.errors) from exc
    return _queued(run, 201)


@router.get("/runs/{int:run_id}/", response={200: schema.Run, **schema.ERRORS}, url_name="run-detail", summary="One run")
def get_run(request: HttpRequest, run_id: int) -> Any:
    return selectors.visible_run_or_404(request.user, run_id)


@router.patch("/runs/{int:run_id}/", response={200: schema.Run, 403: schema.Error, 415: schema.Error, **schema.ERRORS}, url_name="run-detail",
              summary="Set tags, note, archived (owner)")
def update_run(request: HttpRequest, run_id: int, body: schema.RunUpdate = Body(schema.RunUpdate())) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    try:
        return actions.update_run(run, request.user, body.model_dump(exclude_unset=True))
    except actions.BadActionInput as exc:
        raise ApiError(400, str(exc), fields=exc.errors) from exc


@router.delete("/runs/{int:run_id}/", response={200: schema.Deleted, 403: schema.Error, 409: schema.Error, **schema.ERRORS}, url_name="run-detail",
               summary="Delete an ended run (owner); a worker removes its directory")
def delete_run(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    try:
        actions.delete_run(run, request.user)
    except actions.ActionRefused as exc:
        raise ApiError(409, f"cannot delete: {exc}") from exc
    return {"deleted": run_id}


@router.post("/runs/{int:run_id}/clone/", response={201: schema.Run, 415: schema.Error, **schema.ERRORS, **QUEUE_ERRORS}, url_name="run-clone",
             summary="Clone or fork a run")
def clone_run(request: HttpRequest, run_id: int, body: schema.RunClone = Body(schema.RunClone())) -> Any:
    source = selectors.visible_run_or_404(request.user, run_id)
    try:
        run = actions.clone_run(request.user, source, body.name, body.config, body.from_step)
    except actions.BadActionInput as exc:
        raise ApiError(400, str(exc), fields=exc.errors) from exc
    except services.RunLimitExceeded as exc:
        raise ApiError(429, str(exc), fields=exc.errors) from exc
    except services.InvalidRunConfig as exc:
        raise ApiError(400, f"invalid config: {exc}", fields=exc.errors) from exc
    return _queued(run, 201)


@router.post("/runs/{int:run_id}/resume/", response={200: schema.Run, 409: schema.Error, **schema.ERRORS, **QUEUE_ERRORS}, url_name="run-resume",
             summary="Queue an ended run again from its latest checkpoint")
def resume_run(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    try:
        run = actions.resume_run(run, request.user)
    except actions.ActionRefused as exc:
        raise ApiError(409, f"cannot resume: {exc}") from exc
    except services.RunLimitExceeded as exc:
        raise ApiError(429, str(exc), fields=exc.errors) from exc
    return _queued(run, 200)


@router.post("/runs/{int:run_id}/cancel/", response={200: schema.Run, 409: schema.Error, **schema.ERRORS}, url_name="run-cancel",
             summary="Stop a queued or running run")
def cancel_run(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    try:
        return services.request_cancel(run, request.user)
    except services.IllegalTransition as exc:
        raise ApiError(409, f"cannot cancel: {exc}") from exc


@router.get("/runs/{int:run_id}/checkpoints/", response={200: schema.CheckpointList, **schema.ERRORS}, url_name="run-checkpoints",
            summary="Checkpoints on disk (resume and fork points)")
def list_checkpoints(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    return {"run": run.pk, "checkpoints": [info.to_json() for info in actions.run_checkpoints(run)]}
