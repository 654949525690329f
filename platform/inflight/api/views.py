"""The JSON API: thin views over the runs services and selectors.

    POST /api/runs/                  {"name": str, "config": {...RunConfig...}}  → 201 run
    GET  /api/runs/                  ?status=running                             → {"runs": [...]}
    GET  /api/runs/<id>/                                                         → run
    POST /api/runs/<id>/cancel/                                                  → run
    GET  /api/runs/<id>/metrics/     ?since_seq=N[&names=a,b][&limit=n][&format=rows|records]
                                     → raw points after N, paged: "columns" names the fields of each
                                       row [name, step, t, value]; format=records sends objects instead
    GET  /api/runs/<id>/metrics/     [?names=a,b]                                → downsampled snapshot
    GET  /api/runs/<id>/evals/                                                   → {"evals": [...], "count"}
    GET  /api/evals/<id>/                                                        → eval + per-problem results
    GET  /api/leaderboard/           ?sort=-aime24_best[&status=&tag=&q=&owner=&archived=][&limit=&offset=]
                                     → {"rows": [...], "sort", "count", "limit", "offset", "next", "previous"}
    GET  /api/workers/                                                           → {"workers": [...], "count"}

Other users' runs answer 404 (their existence is not revealed); staff see and cancel all.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from inflight.api.auth import api_view, int_param, page_links
from inflight.api.errors import ApiError
from inflight.live.selectors import run_snapshot
from inflight.runs import selectors, services
from inflight.runs.models import EvalScore, Run
from inflight.runs.run_filters import BadFilter, RunFilters

MAX_RAW_POINTS = 50_000
# Leaderboard rows per API answer when no `limit` is given (at most selectors.MAX_LEADERBOARD_PAGE).
LEADERBOARD_API_PAGE = 200
# The fields of one raw metric point, in the order of the rows `metric_points_page` returns.
METRIC_POINT_FIELDS = ("name", "step", "t", "value")
METRIC_POINT_FORMATS = ("rows", "records")


def run_json(run: Run) -> dict[str, Any]:
    return {
        "id": run.pk,
        "name": run.name,
        "owner": run.owner.get_username(),
        "status": run.status,
        "queue": run.queue,
        "error": run.error,
        "config": run.config,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "wall_time_s": run.wall_time_s,
        "worker": run.worker_name,
        "metrics_seq": run.metrics_seq,
    }


def eval_json(score: EvalScore) -> dict[str, Any]:
    return {
        "id": score.pk,
        "run": score.run_id,
        "benchmark": score.benchmark,
        "step": score.step,
        "k": score.k,
        "mean_at_k": score.mean_at_k,
        "pass_at_k": score.pass_at_k,
        "stderr": score.stderr,
        "num_problems": score.num_problems,
        "num_samples": score.num_samples,
        "policy_versions": score.policy_versions,
        "t": score.t,
    }


def _names_param(request: HttpRequest) -> list[str] | None:
    raw = request.GET.get("names")
    if raw is None:
        return None
    return [name for name in (part.strip() for part in raw.split(",")) if name]


@api_view("POST")
def run_cancel(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    try:
        run = services.request_cancel(run, request.user)
    except services.IllegalTransition as exc:
        raise ApiError(409, f"cannot cancel: {exc}") from exc
    return run_json(run)


@api_view("GET")
def run_metrics(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    names = _names_param(request)
    since_seq = int_param(request, "since_seq")
    if since_seq is None:
        return run_snapshot(run, names=names)
    point_format = request.GET.get("format", "rows")
    if point_format not in METRIC_POINT_FORMATS:
        raise ApiError(400, f"query parameter 'format' must be one of {', '.join(METRIC_POINT_FORMATS)}, got {point_format[:40]!r}")
    limit = min(int_param(request, "limit", default=MAX_RAW_POINTS, minimum=1), MAX_RAW_POINTS)
    seq, points, truncated = selectors.metric_points_page(run, since_seq=since_seq, names=names, max_points=limit)
    if point_format == "records":
        points = [dict(zip(METRIC_POINT_FIELDS, row)) for row in points]
    # `seq` is the cursor: with truncated=true ask again with since_seq=seq for the rest.
    return {
        "run": run.pk, "since_seq": since_seq, "seq": seq, "columns": list(METRIC_POINT_FIELDS), "format": point_format,
        "points": points, "truncated": truncated,
    }


@api_view("GET")
def run_evals(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    evals = [eval_json(score) for score in selectors.eval_scores(run)]
    return {"run": run.pk, "evals": evals, "count": len(evals)}


@api_view("GET")
def eval_detail(request: HttpRequest, eval_id: int) -> Any:
    try:
        score = selectors.eval_detail(request.user, eval_id)
    except EvalScore.DoesNotExist as exc:
        raise ApiError(404, f"evaluation {eval_id} not found") from exc
    problems = [
        {
            "problem_id": row.problem_id,
            "answer": row.answer,
            "samples": row.samples,
            "extracted": row.extracted,
            "verdicts": row.verdicts,
            "mean": row.mean,
            "pass": row.passed,
        }
        for row in selectors.eval_problem_results(score)
    ]
    return {**eval_json(score), "problems": problems}


@api_view("GET")
def leaderboard(request: HttpRequest) -> Any:
    # The run list's filters (one parser: runs.run_filters); `sort` is the leaderboard's own column.
    try:
        filters = RunFilters.from_query(request.GET, sort=False)
    except BadFilter as exc:
        raise ApiError(400, str(exc)) from exc
    limit = int_param(request, "limit", default=LEADERBOARD_API_PAGE, minimum=1, maximum=selectors.MAX_LEADERBOARD_PAGE)
    offset = int_param(request, "offset", default=0)
    try:
        # No `sort`: a figure every listed run has (selectors.default_leaderboard_sort).
        page = selectors.leaderboard_page(request.user, request.GET.get("sort") or None, filters, offset=offset, limit=limit)
    except ValueError as exc:
        raise ApiError(400, f"sort: {exc}") from exc
    # `count` is every listed run; `next`/`previous` page through them in the same order.
    return {"sort": page.sort, "rows": page.rows, **page_links(request, page.count, offset, limit)}


@api_view("GET")
def workers(request: HttpRequest) -> Any:
    workers = selectors.workers_with_liveness(request.user)
    return {"workers": workers, "count": len(workers)}
