"""Reads of what runs measured: metrics (raw points after a cursor, or a downsampled snapshot),
evaluations, the leaderboard across runs, and the workers that run them.

Other users' runs answer 404 (their existence is not revealed); staff see all.
"""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Query

from inflight.api import schema
from inflight.api.auth import ApiRouter, OptionalQueryInt, QueryInt, page_links
from inflight.api.errors import ApiError
from inflight.api.run_actions import RunListFilters, run_filters
from inflight.live.selectors import run_snapshot
from inflight.runs import selectors
from inflight.runs.models import EvalScore
from inflight.runs.safe_input import MAX_INT

router = ApiRouter()

# The most raw metric points one answer holds (a page ends at a batch boundary at or below it).
MAX_RAW_POINTS = 50_000
# Leaderboard rows per API answer when no `limit` is given (at most selectors.MAX_LEADERBOARD_PAGE).
LEADERBOARD_API_PAGE = 200
# The fields of one raw metric point, in the order of the rows `metric_points_page` returns.
METRIC_POINT_FIELDS = ("name", "step", "t", "value")
MetricPointFormat = Literal["rows", "records"]


def eval_json(score: EvalScore) -> dict[str, Any]:
    return {
        "id": score.pk, "run": score.run_id, "benchmark": score.benchmark, "step": score.step, "k": score.k,
        "mean_at_k": score.mean_at_k, "pass_at_k": score.pass_at_k, "stderr": score.stderr,
        "num_problems": score.num_problems, "num_samples": score.num_samples,
        "policy_versions": score.policy_versions, "t": score.t,
    }


@router.get("/runs/{int:run_id}/metrics/", response={200: schema.MetricPage | schema.MetricSnapshot, **schema.ERRORS}, tags=["metrics"],
            url_name="run-metrics", summary="Raw points after a cursor (with since_seq), else a downsampled snapshot")
def run_metrics(
    request: HttpRequest, run_id: int,
    since_seq: OptionalQueryInt = Query(None, ge=0, le=MAX_INT, description="Raw points stored after this cursor, paged; omit for the downsampled snapshot."),
    names: str | None = Query(None, description="Comma-separated metric names (default: all)."),
    limit: QueryInt = Query(MAX_RAW_POINTS, ge=1, le=MAX_RAW_POINTS, description="Points per page (a page ends at a batch boundary)."),
    format: MetricPointFormat = Query("rows", description="rows: [name, step, t, value] arrays; records: named objects."),
) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    name_list = None if names is None else [name for name in (part.strip() for part in names.split(",")) if name]
    if since_seq is None:
        return run_snapshot(run, names=name_list)
    seq, points, truncated = selectors.metric_points_page(run, since_seq=since_seq, names=name_list, max_points=limit)
    if format == "records":
        points = [dict(zip(METRIC_POINT_FIELDS, row)) for row in points]
    # `seq` is the cursor: with truncated=true ask again with since_seq=seq for the rest.
    return {
        "run": run.pk, "since_seq": since_seq, "seq": seq, "columns": list(METRIC_POINT_FIELDS), "format": format,
        "points": points, "truncated": truncated,
    }


@router.get("/runs/{int:run_id}/evals/", response={200: schema.EvalList, **schema.ERRORS}, tags=["evaluations"], url_name="run-evals",
            summary="Evaluations per step and benchmark")
def run_evals(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    evals = [eval_json(score) for score in selectors.eval_scores(run)]
    return {"run": run.pk, "evals": evals, "count": len(evals)}


@router.get("/evals/{int:eval_id}/", response={200: schema.EvalDetail, **schema.ERRORS}, tags=["evaluations"], url_name="eval-detail",
            summary="One evaluation with per-problem results")
def eval_detail(request: HttpRequest, eval_id: int) -> Any:
    try:
        score = selectors.eval_detail(request.user, eval_id)
    except EvalScore.DoesNotExist as exc:
        raise ApiError(404, f"evaluation {eval_id} not found") from exc
    problems = [
        {
            "problem_id": row.problem_id, "answer": row.answer, "samples": row.samples, "extracted": row.extracted,
            "verdicts": row.verdicts, "mean": row.mean, "pass": row.passed, "used_tool": row.used_tool,
            "samples_used_tool": row.samples_used_tool,
        }
        for row in selectors.eval_problem_results(score)
    ]
    return {**eval_json(score), "problems": problems}


@router.get("/leaderboard/", response={200: schema.Leaderboard, **schema.ERRORS}, tags=["evaluations"], url_name="leaderboard",
            summary="Best and last scores of every visible run, paged")
def leaderboard(
    request: HttpRequest, filters: Query[RunListFilters],
    sort: str | None = Query(None, description="A column, `-` for descending: " + ", ".join(selectors.LEADERBOARD_SORT_KEYS) + "; none: the "
                             "first of held-out success, MATH-500, AIME 2024, training-batch success that every listed run has "
                             "(`sort` in the answer says which)."),
    limit: QueryInt = Query(LEADERBOARD_API_PAGE, ge=1, le=selectors.MAX_LEADERBOARD_PAGE, description="Rows per page."),
    offset: QueryInt = Query(0, ge=0, le=MAX_INT, description="Rows skipped (follow `next`)."),
) -> Any:
    # The run list's filters (one parser: runs.run_filters); `sort` is the leaderboard's own column.
    parsed = run_filters(request, sort=False)
    try:
        # No `sort`: a figure every listed run has (selectors.default_leaderboard_sort).
        page = selectors.leaderboard_page(request.user, sort or None, parsed, offset=offset, limit=limit)
    except ValueError as exc:
        raise ApiError(400, f"sort: {exc}") from exc
    # `count` is every listed run; `next`/`previous` page through them in the same order.
    return {"sort": page.sort, "rows": page.rows, **page_links(request, page.count, offset, limit)}


@router.get("/workers/", response={200: schema.Workers, 401: schema.Error}, tags=["workers"], url_name="workers",
            summary="Workers and their liveness")
def workers(request: HttpRequest) -> Any:
    rows = selectors.workers_with_liveness(request.user)
    return {"workers": rows, "count": len(rows)}
