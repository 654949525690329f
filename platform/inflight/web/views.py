"""Pages and their JSON endpoints. Reads go through selectors, writes through services.

Login is required everywhere. A run that the user may not see answers 404 (its
existence is not revealed); JSON endpoints answer 401 with a message instead of
redirecting to the login page.
"""

from __future__ import annotations

from functools import wraps
from dataclasses import dataclass
from typing import Any, Callable

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotFound, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from pydantic import ValidationError

from inflight.api.errors import error_response, json_response
from inflight.live.selectors import run_snapshot_json as snapshot_json_text
from inflight.runs.run_paths import checkpoints_of
from inflight.runs.selectors import MAX_RUN_ID, runs_visible_to, visible_run_or_404, workers_with_liveness
from inflight.runs.services import IllegalTransition, InvalidRunConfig, create_run, request_cancel
from inflight.web import sweep_form
from inflight.web.charts import CHART_GROUPS
from inflight.web.config_form import (
    DEFAULT_PRESET,
    available_presets,
    build_sections,
    config_from_post,
    comment_lines,
    config_view_rows,
    error_summary,
    form_values,
    load_preset,
    parse_yaml_config,
    resolved_values,
    unshown_paths,
)
from inflight.web.selectors import latest_evaluations, status_rows

from rl_core.config.run_config import RunConfig
from rl_core.config.files import field_errors, with_run_defaults

# Each run's snapshot is at most MAX_BUCKETS buckets per series (live/downsample.py), so a compare's
# data stays bounded; 20 runs answer in well under 300 ms server time (bench/platform_scale.py).
MAX_COMPARED_RUNS = 50
MAX_SHIFT = 40


def _error_page(request: HttpRequest, status: int, message: str) -> HttpResponse:
    return render(request, "inflight/error.html", {"status": status, "message": message}, status=status)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF refusal (settings.CSRF_FAILURE_VIEW). A page's JSON endpoint (`*.json`) or
    the API answers in the platform's JSON error shape, so its script can say what went wrong;
    a page gets the site's own error page instead of Django's."""
    message = f"CSRF check failed ({reason or 'no reason given'}): reload the page and send the form again"
    if request.path.endswith(".json") or request.path.startswith("/api/"):
        return error_response(403, message + "; a script sends the csrftoken cookie's value as the X-CSRFToken header")
    return _error_page(request, 403, message + ".")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Every address nothing answers (`/runs/abc/`, a mistyped path): the site's own 404 page in
    its layout, saying which address and where to go, instead of Django's bare one (the root
    urlconf's `handler404`). Under /api/ a plain 404 is left for `ApiErrorShapeMiddleware` to put
    in the API's error shape; a page's JSON endpoint answers in that shape too."""
    message = f"No page at {request.path[:200]}"
    if request.path.startswith("/api/"):
        return HttpResponseNotFound(message, content_type="text/plain")
    if request.path.endswith(".json"):
        return error_response(404, message)
    return render(request, "inflight/error.html", {"status": 404, "message": message + ".", "not_found_path": request.path[:200]}, status=404)


def json_login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A JSON endpoint of the pages: 401 (not a redirect) when signed out, Http404 → JSON 404,
    in the platform's one error shape (`api.errors`)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return error_response(401, "sign in to read this run")
        try:
            return view(request, *args, **kwargs)
        except Http404 as exc:
            return error_response(404, str(exc))

    return wrapper


def page_404(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page whose run is not visible (Http404) renders the platform's error page."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except Http404 as exc:
            return _error_page(request, 404, f"{str(exc).capitalize()}.")

    return wrapper


def _parse_ids(parts: list[str]) -> list[int]:
    """Run ids from text; ValueError naming the first bad one."""
    ids = []
    for part in parts:
        part = part.strip()
        if not part.isdigit() or int(part) > MAX_RUN_ID:
            raise ValueError(f"{part[:40]!r} is not a run id")
        ids.append(int(part))
    return list(dict.fromkeys(ids))


# ---------------------------------------------------------------- runs list


@json_login_required
@require_GET
def runs_status_json(request: HttpRequest) -> HttpResponse:
    """Status of the listed runs (`?ids=1,2,3`) the user may see; the runs list polls this."""
    raw = request.GET.get("ids", "")
    try:
        ids = _parse_ids([part for part in raw.split(",") if part.strip()])
    except ValueError as exc:
        return error_response(400, f"ids: expected comma-separated run ids; {exc}")
    if len(ids) > 500:
        return error_response(400, "ids: at most 500 runs per request")
    runs = runs_visible_to(request.user).filter(pk__in=ids)
    return JsonResponse({"runs": status_rows(runs, with_progress=True)})


# ---------------------------------------------------------------- create


def _create_context(request: HttpRequest, values: dict[str, Any], errors: dict[str, list[str]], raw: dict[str, str], yaml_text: str, tab: str, preset: str) -> dict[str, Any]:
    start_from_errors = errors.pop("start_from", [])
    top_fields, sections, general_errors = build_sections(values, errors, raw)
    summary = error_summary(top_fields, sections, start_from_errors)
    return {
        "error_summary": summary,
        "error_count": len(summary) + len(general_errors),
        "checkpoints": checkpoints_of(request.user),
        "start_from": request.POST.get("start_from", "") if request.method == "POST" else "",
        "start_from_errors": start_from_errors,
        "general_errors": general_errors,
        "top_fields": top_fields,
        "sections": sections,
        "presets": available_presets(),
        "preset": preset,
        "yaml_text": yaml_text,
        "tab": tab,
        "sweep_form": sweep_form.form_state(request, errors),
    }


def _schema_errors(data: dict[str, Any]) -> dict[str, list[str]]:
    try:
        RunConfig.model_validate(with_run_defaults(data))
    except ValidationError as exc:
        return field_errors(exc)
    return {}


@dataclass
class Submission:
    """A create page's submission, a new run's or a clone's, read one way: which tab sent it
    (`form` or `yaml`), the config it holds, what could not be read (path → messages), the form's
    texts as typed and the YAML tab's text."""

    tab: str
    data: dict[str, Any]
    errors: dict[str, list[str]]
    raw: dict[str, str]
    yaml_text: str

    def add_schema_errors(self) -> None:
        """A submission refused while being read also shows what the schema says about the fields
        that did parse (an unknown key among them), so one round trip names every problem."""
        for path, items in _schema_errors(self.data).items():
            self.errors.setdefault(path, items)

    def shown_yaml(self, values: dict[str, Any]) -> str:
        """The YAML tab's text on the page answering it: as sent, or the form's values."""
        return self.yaml_text if self.tab == "yaml" else yaml.safe_dump(values, sort_keys=False)

    def yaml_errors(self, errors: dict[str, list[str]]) -> list[str]:
        """The YAML tab's list of the refusal's problems, each with the path it is about (none for
        the form tab, whose problems sit next to their fields)."""
        if self.tab != "yaml":
            return []
        return [f"{path}: {m}" if path != "config" else m for path, items in errors.items() for m in items]


def read_submission(request: HttpRequest) -> Submission:
    """The create page's POST (run_create and run_clone alike): the YAML tab's text or the form's fields."""
    if request.POST.get("mode") == "yaml":
        yaml_text = request.POST.get("config_yaml", "")
        data, problem = parse_yaml_config(yaml_text)
        return Submission("yaml", data or {}, {"config": [problem]} if problem else {}, {}, yaml_text)
    data, errors, raw = config_from_post(request.POST)
    return Submission("form", data, errors, raw, "")


def _apply_start_from(request: HttpRequest, data: dict[str, Any], errors: dict[str, list[str]]) -> None:
    """The form's "start from checkpoint" choice, resolved here, server-side: the model is that
    checkpoint's directory (one of the user's own runs'), or an error on `start_from`."""
    start_from = request.POST.get("start_from", "")
    if not start_from:
        return
    choice = next((c for c in checkpoints_of(request.user) if c.key == start_from), None)
    if choice is None:
        errors.setdefault("start_from", []).append("not a checkpoint of one of your runs")
        return
    model = data.setdefault("model", {})
    if isinstance(model, dict):
        model["path"] = choice.path
        model["build_tiny_if_missing"] = False


@json_login_required
@require_POST
def run_create_sync(request: HttpRequest) -> HttpResponse:
    """The create page's Form and YAML tabs are one config in two views (static/inflight/config_sync.js):
    `to=yaml` turns the posted form fields into the YAML tab's text; `to=form` turns `config_yaml`
    into what each input shows (`values`), with what the form cannot show (`unshown`: dotted
    paths; `comments`: comment lines), so the page says so rather than drop it. Parsed as a
    submission is (config_from_post, parse_yaml_config, resolved_values); nothing is stored."""
    target = request.POST.get("to", "")
    if target == "yaml":
        data, errors, _ = config_from_post(request.POST)
        _apply_start_from(request, data, errors)
        return json_response({"yaml": yaml.safe_dump(resolved_values(data), sort_keys=False), "errors": errors})
    if target == "form":
        text = request.POST.get("config_yaml", "")
        data, problem = parse_yaml_config(text)
        if problem or data is None:
            return error_response(400, f"config_yaml: {problem}")
        return json_response({"values": form_values(resolved_values(data)), "unshown": unshown_paths(data), "comments": comment_lines(text)})
    return error_response(400, "to: use yaml (form fields to YAML) or form (config_yaml to form fields)")


@login_required
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        preset = request.GET.get("preset", DEFAULT_PRESET)
        data: dict[str, Any] = {}
        if preset:
            try:
                data = load_preset(preset)
            except ValueError as exc:
                return _error_page(request, 400, str(exc))
        values = resolved_values(data)
        # A preset that no longer matches the schema is shown with its errors, not refused.
        errors = _schema_errors(data) if data else {}
        context = _create_context(request, values, errors, {}, yaml.safe_dump(values, sort_keys=False), "form", preset)
        return render(request, "inflight/run_create.html", context)

    submission = read_submission(request)
    data, errors = submission.data, submission.errors
    _apply_start_from(request, data, errors)
    if not errors and sweep_form.asked(request):
        # The Sweep panel (web/sweep_form.py): the form's config as the base of a sweep.
        try:
            group = sweep_form.create_from_post(request, request.user, data)
        except InvalidRunConfig as exc:
            errors = exc.errors
        else:
            waiting = f"; {len(group.waiting)} wait for a free slot under your active-run limit and are queued as your runs end" if group.waiting else ""
            messages.success(request, f"Sweep “{group.name}”: {group.runs.count()} runs queued{waiting}.")
            return redirect("web:run_list")
    elif not errors:
        try:
            run = create_run(request.user, "", data)
        except InvalidRunConfig as exc:
            errors = exc.errors
        else:
            messages.success(request, f"Run #{run.pk} “{run.name}” queued on the {run.queue} queue.")
            return redirect("web:run_detail", run_id=run.pk)
    else:
        submission.add_schema_errors()
    values = resolved_values(data)
    context = _create_context(request, values, errors, submission.raw, submission.shown_yaml(values), submission.tab, request.POST.get("preset", ""))
    context["yaml_errors"] = submission.yaml_errors(errors)
    return render(request, "inflight/run_create.html", context, status=400)


# ---------------------------------------------------------------- one run


@login_required
@require_GET
@page_404
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = visible_run_or_404(request.user, run_id)
    evaluations = latest_evaluations(run)
    eval_points = [
        {"benchmark": item["benchmark"], "step": score.step, "mean_at_k": score.mean_at_k, "pass_at_k": score.pass_at_k, "k": score.k}
        for item in evaluations
        for score in item["history"]
    ]
    page = {
        "run_id": run.pk,
        "status": run.status,
        "wall_time_s": run.wall_time_s,  # the page counts on from it (run_page.js)
        "snapshot_url": reverse("web:run_snapshot", args=[run.pk]),
        "status_url": reverse("web:run_status", args=[run.pk]),
        "panel_url": reverse("web:run_panel", args=[run.pk]),
        "ws_path": f"/ws/runs/{run.pk}/",
        "samples_per_step": int((run.config or {}).get("trainer", {}).get("samples_per_step", 1) or 1),
        "charts": CHART_GROUPS,
        "evals": eval_points,
    }
    return render(
        request,
        "inflight/run_detail.html",
        {
            "run": run,
            "page": page,
            "config_yaml": json_to_yaml(run.config),
            "config_rows": config_view_rows(run.config or {}),
            "evaluations": evaluations,
            "can_stop": not run.is_terminal and run.status != "cancelling",
        },
    )


def json_to_yaml(config: Any) -> str:
    return yaml.safe_dump(config or {}, sort_keys=False)


def _snapshot_query(request: HttpRequest) -> tuple[list[str] | None, int] | HttpResponse:
    """(names or None for all, min_shift) of a snapshot request, or its 400."""
    names = None
    if "names" in request.GET:
        names = [name for name in request.GET["names"].split(",") if name]
        if any(len(name) > 120 for name in names):
            return error_response(400, "names: a metric name is at most 120 characters")
    try:
        min_shift = int(request.GET.get("min_shift", "0"))
    except ValueError:
        return error_response(400, f"min_shift: expected an integer, got {request.GET['min_shift'][:40]!r}")
    if not 0 <= min_shift <= MAX_SHIFT:
        return error_response(400, f"min_shift: must be between 0 and {MAX_SHIFT}")
    return names, min_shift


@json_login_required
@require_GET
def run_snapshot_json(request: HttpRequest, run_id: int) -> HttpResponse:
    """Downsampled series up to `seq` (`?names=a,b` to filter, `?min_shift=k` for a coarser grid)."""
    run = visible_run_or_404(request.user, run_id)
    query = _snapshot_query(request)
    if isinstance(query, HttpResponse):
        return query
    names, min_shift = query
    # Built as JSON text in PostgreSQL and passed through unparsed (the 1M-point budget).
    return HttpResponse(snapshot_json_text(run, names=names, min_shift=min_shift), content_type="application/json")


@json_login_required
@require_GET
def runs_snapshots_json(request: HttpRequest) -> HttpResponse:
    """`{"snapshots": [...]}`: the snapshots of `?runs=1,2,3` in that order, each exactly what
    runs/<id>/snapshot.json answers with the same `names` and `min_shift`. The compare page's first
    load: one request instead of one per run (at 20 runs the per-request work, session, user and
    run lookups, was about half of the compare's server time, bench/scale_finished.py)."""
    try:
        ids = _parse_ids([part for part in request.GET.get("runs", "").split(",") if part.strip()])
    except ValueError as exc:
        return error_response(400, f"runs: expected comma-separated run ids; {exc}")
    if not ids:
        return error_response(400, "runs: name at least one run id")
    if len(ids) > MAX_COMPARED_RUNS:
        return error_response(400, f"runs: at most {MAX_COMPARED_RUNS} runs per request (the compare page's limit)")
    query = _snapshot_query(request)
    if isinstance(query, HttpResponse):
        return query
    names, min_shift = query
    visible = {run.pk: run for run in runs_visible_to(request.user).filter(pk__in=ids)}
    unknown = [run_id for run_id in ids if run_id not in visible]
    if unknown:
        return error_response(404, f"runs: {', '.join(f'#{i}' for i in unknown)} do not exist or are not yours")
    # Each snapshot is JSON text from PostgreSQL: joined as text, never parsed here.
    texts = [snapshot_json_text(visible[run_id], names=names, min_shift=min_shift) for run_id in ids]
    return HttpResponse('{"snapshots": [' + ", ".join(texts) + "]}", content_type="application/json")


@json_login_required
@require_GET
def run_status_json(request: HttpRequest, run_id: int) -> HttpResponse:
    run = visible_run_or_404(request.user, run_id)
    return JsonResponse(status_rows([run])[0])


@login_required
@require_POST
@page_404
def run_stop(request: HttpRequest, run_id: int) -> HttpResponse:
    run = visible_run_or_404(request.user, run_id)
    try:
        run = request_cancel(run, request.user)
    except PermissionDenied as exc:
        return _error_page(request, 403, str(exc))
    except IllegalTransition as exc:
        messages.error(request, f"Nothing to stop: {exc}.")
        return redirect("web:run_detail", run_id=run_id)
    messages.info(request, f"Stop requested; the run is {run.status}.")
    return redirect("web:run_detail", run_id=run_id)


# ---------------------------------------------------------------- compare and leaderboard (their views: run_actions), workers


# (row key, header, what it measures, how it is shown). Held-out figures first: they are measured
# on problems the run never trains on; the training batch is the noisiest figure, and says so.
LEADERBOARD_COLUMNS = [
    ("heldout_last", "Held-out success, latest", "mean@k on the task's held-out problems at the latest held-out evaluation", "percent"),
    ("heldout_best", "Held-out success, best", "the highest mean@k over the run's held-out evaluations", "percent"),
    ("math500_last", "MATH-500, latest", "mean@k on MATH-500 at the latest benchmark evaluation", "percent"),
    ("math500_best", "MATH-500, best", "the highest MATH-500 mean@k over the run's evaluations", "percent"),
    ("aime24_last", "AIME 2024, latest", "mean@k on AIME 2024 at the latest benchmark evaluation", "percent"),
    ("aime24_best", "AIME 2024, best", "the highest AIME 2024 mean@k over the run's evaluations", "percent"),
    ("success_recent", "Train-batch success, last 10 steps", "share of correct samples in the training batches of the last 10 steps (problems being trained on)", "percent"),
    ("success_best", "Train-batch success, best step", "the best single training batch: the noisiest figure here, an upper outlier", "percent"),
    ("throughput", "Rollout tokens/s", "mean generated tokens per second over the run", "figure"),
    ("wall_time_s", "Wall time", "time spent running (not queued or stopped)", "duration"),
]


@login_required
@require_GET
def workers(request: HttpRequest) -> HttpResponse:
    return render(request, "inflight/workers.html", {"workers": workers_with_liveness(request.user), "full": request.user.is_staff})
