"""Pages that act on runs: the filtered, sortable run list; "New run from this" (clone, or fork
from a checkpoint) on the create form with a diff against the source; resume; tags / note /
archive; delete with confirmation; compare and leaderboard with the list's filters and a
shareable compare URL. Writes go through `inflight.runs.actions`."""

from __future__ import annotations

from typing import Any

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from inflight.api.errors import error_response, json_response
from inflight.runs import actions
from inflight.runs.group_selectors import DEFAULT_TARGET, Target, group_counts
from inflight.runs.models import MetricPoint, Run
from inflight.runs.run_env import run_env_name
from inflight.runs.run_filters import METRIC_SORT_DESCENDING_FIRST, METRIC_SORT_KEYS, BadFilter, RunFilters, all_tags, filter_runs
from inflight.runs.selectors import leaderboard_page, runs_visible_to, visible_run_or_404
from inflight.runs.services import InvalidRunConfig, RunLimitExceeded, check_run_for_owner, create_run, validate_run_config
from inflight.web import group_compare
from inflight.web import views as base_views
from inflight.web.config_form import form_values, changed_fields, parse_yaml_config, resolved_values
from inflight.web.selectors import LIST_PICKABLE_COLUMNS, TRIAGE_METRICS, config_diff, triage

LIST_COLUMNS = [("id", "#"), ("name", "Name"), ("owner", "Owner"), ("mode", "Mode"), ("queue", "Queue"), ("status", "Status"), ("created", "Created"), ("started", "Started")]


def _filters_or_400(request: HttpRequest) -> RunFilters | HttpResponse:
    try:
        return RunFilters.from_query(request.GET)
    except BadFilter as exc:
        return base_views._error_page(request, 400, str(exc))


def _sort_links(filters: RunFilters, columns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    key = filters.sort.lstrip("-")
    out = []
    for column, label in columns:
        active = column == key
        descending_first = column in ("created", "started", "id", *METRIC_SORT_DESCENDING_FIRST)
        following = (column if filters.sort.startswith("-") else f"-{column}") if active else f"-{column}" if descending_first else column
        out.append({"key": column, "label": label, "active": active, "descending": filters.sort.startswith("-"), "query": filters.query_string(sort=following)})
    return out


# Rows of one page of the run list and of the leaderboard: what a page renders (sparklines,
# progress bars) stays bounded however many runs there are (bench/platform_scale.py, 2,000 runs).
RUNS_PER_PAGE = 50


def _page_of(request: HttpRequest, count: int, per_page: int = RUNS_PER_PAGE) -> dict[str, Any]:
    """The page asked for (`?page=N`, 1-based; out of range: the nearest one) of `count` rows:
    its number, offset, and what the pager shows."""
    pages = max(1, -(-count // per_page))
    raw = request.GET.get("page", "")
    number = int(raw) if raw.isdigit() and len(raw) < 10 else 1
    number = min(max(number, 1), pages)
    offset = (number - 1) * per_page
    return {"number": number, "pages": pages, "offset": offset, "limit": per_page, "count": count,
            "first": offset + 1 if count else 0, "last": min(count, offset + per_page)}


def _pager_links(page: dict[str, Any], query: str) -> dict[str, Any]:
    """Links to the pages beside this one, keeping the rest of the query (filters, sort)."""
    def link(number: int) -> str:
        return f"?{query}&page={number}" if query else f"?page={number}"

    page = dict(page)
    page["previous"] = link(page["number"] - 1) if page["number"] > 1 else None
    page["next"] = link(page["number"] + 1) if page["number"] < page["pages"] else None
    page["first_link"] = link(1) if page["number"] > 2 else None
    page["last_link"] = link(page["pages"]) if page["number"] < page["pages"] - 1 else None
    return page


@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    filters = _filters_or_400(request)
    if isinstance(filters, HttpResponse):
        return filters
    visible = runs_visible_to(request.user)
    listed = filter_runs(visible, filters, request.user)
    page = _page_of(request, listed.count())
    runs = list(listed[page["offset"]:page["offset"] + page["limit"]])
    columns = [c for c in LIST_COLUMNS if c[0] != "owner" or request.user.is_staff]
    # A sweep is one row (its counts over all its runs, two queries for the page) above its first
    # run on this page; its runs are folded under it until the row is opened (run_list.js).
    groups = group_counts(run.group_id for run in runs if run.group_id)
    group_heads: dict[int, dict[str, Any]] = {}
    for run in runs:
        if run.group_id in groups and not any(head["id"] == run.group_id for head in group_heads.values()):
            group_heads[run.pk] = groups[run.group_id]
    # The sort links start again at page 1; the pager keeps the sort.
    return render(request, "inflight/run_list.html", {
        "runs": runs, "triage": triage(runs), "triage_metrics": TRIAGE_METRICS, "group_heads": group_heads,
        "pickable": [{"key": key, "label": label, "default": default} for key, (label, default) in LIST_PICKABLE_COLUMNS.items()
                     if key != "owner" or request.user.is_staff],
        "hidden_by_default": [key for key, (_, default) in LIST_PICKABLE_COLUMNS.items() if not default],
        "filters": filters, "columns": _sort_links(filters, columns), "tags": all_tags(visible),
        # The figure columns sort too (in the database: runs.run_filters.METRIC_SORT_KEYS).
        "metric_sorts": {link["key"]: link for link in _sort_links(filters, [(key, key) for key in METRIC_SORT_KEYS])},
        "statuses": Run._meta.get_field("status").choices, "any_runs": runs or visible.exists(),
        "filter_query": filters.query_string(), "page": _pager_links(page, filters.query_string()),
    })


# ---------------------------------------------------------------- clone / fork


def _from_step(request: HttpRequest) -> int | None:
    raw = request.GET.get("from_step", "")
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 12:
        raise actions.BadActionInput({"from_step": [f"{raw[:20]!r} is not a step"]})
    return int(raw)


@login_required
@require_http_methods(["GET", "POST"])
@base_views.page_404
def run_clone(request: HttpRequest, run_id: int) -> HttpResponse:
    """The create form prefilled with a visible run's config (`?from_step=N`: a fork whose model
    is that checkpoint), showing what differs from the source as the user edits; the new run
    records its parent."""
    source = visible_run_or_404(request.user, run_id)
    try:
        from_step = _from_step(request)
        source_values = resolved_values(actions.clone_config(source, {}, from_step))
    except actions.BadActionInput as exc:
        return base_views._error_page(request, 400, str(exc))
    source_values["name"] = f"{source.name}-{'fork' if from_step is not None else 'clone'}"
    if request.method == "GET":
        context = base_views._create_context(request, source_values, {}, {}, yaml.safe_dump(source_values, sort_keys=False), "form", "")
        return render(request, "inflight/run_create.html", {**context, **_clone_context(source, from_step, source_values, source_values)})

    # Read and refused as the new-run page's submission is (views.read_submission).
    submission = base_views.read_submission(request)
    data, errors = submission.data, submission.errors
    fork_path = source_values["model"]["path"] if from_step is not None else None
    if not errors:
        try:
            # A fork only while the model is still the chosen checkpoint; else a plain clone.
            model_path = (data.get("model") or {}).get("path") if isinstance(data.get("model"), dict) else None
            parent_step = from_step if fork_path is not None and model_path == fork_path else None
            with transaction.atomic():
                run = create_run(request.user, "", data)
                actions.record_lineage(run, source, parent_step)
        except InvalidRunConfig as exc:
            errors = exc.errors
        else:
            messages.success(request, f"Run #{run.pk} “{run.name}” queued on the {run.queue} queue (from #{source.pk}).")
            return redirect("web:run_detail", run_id=run.pk)
    else:
        submission.add_schema_errors()
    values = resolved_values(data)
    context = base_views._create_context(request, values, errors, submission.raw, submission.shown_yaml(values), submission.tab, "")
    context["yaml_errors"] = submission.yaml_errors(errors)
    return render(request, "inflight/run_create.html", {**context, **_clone_context(source, from_step, source_values, values)}, status=400)


@base_views.json_login_required
@require_POST
def run_clone_diff(request: HttpRequest, run_id: int) -> HttpResponse:
    """The clone page's YAML tab, as the user types: `config_yaml` (form-encoded, CSRF-checked
    like the page's own forms) → `{"diff": [{"path", "source", "new"}], "errors": {path: [..]}}`:
    the diff against the source run's config, by the same `changed_fields` the form's diff and a
    rejected submission use, and what a submission of this text would be refused for (the same
    checks: values, paths, limits; `{}` when it would be accepted); 400 with the parser's message
    for text that is not a YAML mapping. Nothing is stored."""
    source = visible_run_or_404(request.user, run_id)
    try:
        _from_step(request)  # a fork's page posts its ?from_step=; a malformed one is refused alike
    except actions.BadActionInput as exc:
        return error_response(400, str(exc), fields=exc.errors)
    data, problem = parse_yaml_config(request.POST.get("config_yaml", ""))
    if problem or data is None:
        return error_response(400, f"config_yaml: {problem}")
    errors: dict[str, list[str]] = {}
    try:
        check_run_for_owner(request.user, validate_run_config(data))
    except InvalidRunConfig as exc:
        errors = exc.errors
    return json_response({"run": source.pk, "diff": changed_fields(source.config or {}, resolved_values(data)), "errors": errors})


def _clone_context(source: Run, from_step: int | None, source_values: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    return {
        "clone_source": source,
        "clone_step": from_step,
        "clone_diff": changed_fields(source.config or {}, values),
        # What each input showed for the source: the page's script diffs the form against it.
        "clone_form_values": form_values(source_values),
        "source_config": source.config or {},
    }


# ---------------------------------------------------------------- resume, edit, delete


@login_required
@require_POST
@base_views.page_404
def run_resume(request: HttpRequest, run_id: int) -> HttpResponse:
    run = visible_run_or_404(request.user, run_id)
    try:
        run = actions.resume_run(run, request.user)
    except PermissionDenied as exc:
        return base_views._error_page(request, 403, str(exc))
    except (actions.ActionRefused, RunLimitExceeded) as exc:
        messages.error(request, f"Cannot resume: {exc}")
    else:
        messages.info(request, f"Run #{run.pk} resumes from its latest checkpoint; it is {run.status}.")
    return redirect("web:run_detail", run_id=run_id)


# Session key of the tags a user typed that were refused: the run page shows them back.
LABELS_DRAFT_KEY = "labels-draft-{run_id}"


@login_required
@require_POST
@base_views.page_404
def run_edit(request: HttpRequest, run_id: int) -> HttpResponse:
    """Tags (comma-separated), note, archive/restore — the owner's form on the run page."""
    run = visible_run_or_404(request.user, run_id)
    changes: dict[str, Any] = {}
    if "tags" in request.POST:
        changes["tags"] = [tag for tag in request.POST["tags"].split(",")]
    if "note" in request.POST:
        changes["note"] = request.POST["note"]
    if "archived" in request.POST:
        changes["archived"] = request.POST["archived"] == "1"
    try:
        actions.update_run(run, request.user, changes)
    except PermissionDenied as exc:
        return base_views._error_page(request, 403, str(exc))
    except actions.BadActionInput as exc:
        # What was valid is saved all the same: a refused tag never loses the note typed with it,
        # and the tags as typed come back in the form (its details open) to be corrected.
        valid = {key: value for key, value in changes.items() if key not in exc.errors}
        saved = ""
        if valid:
            actions.update_run(run, request.user, valid)
            saved = " " + " and ".join(sorted(valid)).capitalize() + " saved."
        if "tags" in exc.errors:
            request.session[LABELS_DRAFT_KEY.format(run_id=run.pk)] = request.POST.get("tags", "")[:2000]
        problems = "; ".join(f"{key}: {message}" for key, items in exc.errors.items() for message in items)
        messages.error(request, f"Not saved: {problems}.{saved}")
    else:
        messages.success(request, "Archived." if changes.get("archived") else "Saved.")
    return redirect("web:run_detail", run_id=run_id)


@login_required
@require_http_methods(["GET", "POST"])
@base_views.page_404
def run_delete(request: HttpRequest, run_id: int) -> HttpResponse:
    """GET: the confirmation page (the owner types the run's id); POST: delete."""
    run = visible_run_or_404(request.user, run_id)
    if run.owner_id != request.user.pk:
        return base_views._error_page(request, 403, "only the run's owner may delete it")
    if request.method == "POST":
        if request.POST.get("confirm", "").strip() != str(run.pk):
            messages.error(request, f"Type {run.pk} to confirm.")
            return redirect("web:run_delete", run_id=run.pk)
        try:
            actions.delete_run(run, request.user)
        except actions.ActionRefused as exc:
            messages.error(request, f"Cannot delete: {exc}")
            return redirect("web:run_detail", run_id=run.pk)
        messages.success(request, f"Run #{run_id} “{run.name}” deleted; a worker removes its directory.")
        return redirect("web:run_list")
    return render(request, "inflight/run_delete.html", {"run": run, "children": run.children.count()})


# ---------------------------------------------------------------- compare and leaderboard


def _lineage_offset(run: Run, visible_ids: set[int]) -> int:
    """Steps before this run's step 0 along its fork chain: a fork of step k of a run that is
    itself a fork of step j starts at j + k on the compare page's step axis."""
    offset, seen, current = 0, set(), run
    while current.parent_step is not None and current.pk not in seen:
        seen.add(current.pk)
        offset += current.parent_step
        # A deleted parent (parent_id set to NULL) still forked at parent_step: count it, stop there.
        if not current.parent_id or current.parent_id not in visible_ids:
            break
        current = current.parent
    return offset


def _metric_names(run_ids: list[int]) -> list[str]:
    """Every metric name the runs logged, sorted: a loose scan of the (run, name, step) index
    (one probe per run and name), never the points themselves."""
    if not run_ids:
        return []
    table = MetricPoint._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE found(run_id, name) AS ("
            f" SELECT r.id, (SELECT min(p.name) FROM {table} p WHERE p.run_id = r.id) FROM unnest(%s::bigint[]) AS r(id)"
            f" UNION ALL"
            f" SELECT f.run_id, (SELECT min(p.name) FROM {table} p WHERE p.run_id = f.run_id AND p.name > f.name) FROM found f WHERE f.name IS NOT NULL"
            f") SELECT DISTINCT name FROM found WHERE name IS NOT NULL ORDER BY name",
            [run_ids],
        )
        return [name for (name,) in cursor.fetchall()]


@login_required
@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    """Compare with the run list's filters for the picker; the URL holds the whole view
    (`runs`, `metrics`, `x`, `smooth`), so it can be sent to anyone who may see those runs."""
    filters = _filters_or_400(request)
    if isinstance(filters, HttpResponse):
        return filters
    raw_ids = [part for value in request.GET.getlist("runs") for part in value.split(",") if part.strip()]
    try:
        ids = base_views._parse_ids(raw_ids)
    except ValueError as exc:
        return base_views._error_page(request, 400, f"runs: expected run ids; {exc}")
    if len(ids) > base_views.MAX_COMPARED_RUNS:
        return base_views._error_page(request, 400, f"runs: compare at most {base_views.MAX_COMPARED_RUNS} runs at once")
    try:
        group_ids = base_views._parse_ids([part for value in request.GET.getlist("groups") for part in value.split(",") if part.strip()])
        target = Target.parse(request.GET.get("target"))
    except ValueError as exc:
        return base_views._error_page(request, 400, str(exc) if str(exc).startswith("target") else f"groups: expected sweep ids; {exc}")
    band = request.GET.get("band", "minmax")
    if band not in group_compare.BANDS:
        return base_views._error_page(request, 400, "band: use minmax or sd")
    visible_runs = runs_visible_to(request.user)
    visible = {run.pk: run for run in visible_runs.filter(pk__in=ids).select_related("parent")}
    unknown = [run_id for run_id in ids if run_id not in visible]
    if unknown:
        return base_views._error_page(request, 404, f"Run(s) {', '.join(f'#{i}' for i in unknown)} do not exist or are not yours.")
    groups: list[dict[str, Any]] | None = None
    loose_ids = list(ids)
    if group_ids:
        # Group mode: each sweep is one curve (mean and band over its runs), each listed run a group of one.
        try:
            sweeps, members = group_compare.group_runs(request.user, group_ids)
        except group_compare.GroupNotVisible as exc:
            return base_views._error_page(request, 404, str(exc))
        grouped_runs, groups = group_compare.compare_groups(sweeps, members, [visible[run_id] for run_id in ids])
        if len(grouped_runs) > base_views.MAX_COMPARED_RUNS:
            return base_views._error_page(request, 400, f"groups: compare at most {base_views.MAX_COMPARED_RUNS} runs at once (these sweeps hold {len(grouped_runs)})")
        visible.update({run.pk: run for run in grouped_runs})
        ids = [run.pk for run in grouped_runs]
    x_axis = request.GET.get("x", "step")
    if x_axis not in ("step", "time", "samples"):
        return base_views._error_page(request, 400, "x: use step, time or samples")
    try:
        smoothing = float(request.GET.get("smooth", "0.6"))
    except ValueError:
        return base_views._error_page(request, 400, "smooth: a number between 0 and 0.99")
    if not 0 <= smoothing <= 0.99:
        return base_views._error_page(request, 400, "smooth: a number between 0 and 0.99")
    metrics = [name for value in request.GET.getlist("metrics") for name in value.split(",") if name.strip()][:20]
    runs = [visible[run_id] for run_id in ids]
    visible_ids = set(visible_runs.values_list("pk", flat=True)) if any(run.parent_id for run in runs) else set()
    page = {
        "runs": [
            {"id": run.pk, "name": run.name, "snapshot_url": reverse("web:run_snapshot", args=[run.pk]),
             "status": run.status, "env": run_env_name(run.config), "ws_path": f"/ws/runs/{run.pk}/",  # compare.js follows each run live
             "samples_per_step": int((run.config or {}).get("trainer", {}).get("samples_per_step", 1) or 1),
             "step_offset": _lineage_offset(run, visible_ids), "parent": run.parent_id, "parent_step": run.parent_step}
            for run in runs
        ],
        "snapshots_url": reverse("web:compare_snapshots"),  # the first load: every run's snapshot in one request
        "metrics": metrics, "x": x_axis, "smooth": smoothing,
        "groups": groups, "band": band, "band_words": group_compare.BANDS[band], "loose_runs": loose_ids,
        # The picker's names: compare.js then fetches each run's snapshot of the charted metrics
        # only (20 runs x 40+ metrics in full was ~10 MB of JSON per page view).
        "metric_names": _metric_names([run.pk for run in runs]),
    }
    return render(request, "inflight/compare.html", {
        "runs": runs, # The picker shows id, name and status: the 200 runs' configs are not read.
        "choices": list(filter_runs(visible_runs, filters, request.user).select_related(None).only("id", "name", "status")[:200]), "selected": set(loose_ids), "group_ids": group_ids,
        "diff": config_diff(runs) if len(runs) > 1 else [], "page": page, "filters": filters, "tags": all_tags(visible_runs),
        "statuses": Run._meta.get_field("status").choices, "x_axis": x_axis, "smoothing": smoothing,
        "groups": groups, "band": band, "bands": group_compare.BANDS, "to_target": group_compare.time_to_target_rows(runs, groups, target),
    })


@login_required
@require_GET
def leaderboard(request: HttpRequest) -> HttpResponse:
    """The leaderboard of the runs that pass the run list's filters (`sort` stays the
    leaderboard's own column), a page of RUNS_PER_PAGE rows at a time, sorted over all of them."""
    try:
        filters = RunFilters.from_query(request.GET, sort=False)
    except BadFilter as exc:
        return base_views._error_page(request, 400, str(exc))
    raw = request.GET.get("page", "")
    number = int(raw) if raw.isdigit() and len(raw) < 10 else 1
    try:
        # No `sort`: a figure every listed run has (runs.selectors.default_leaderboard_sort).
        table = leaderboard_page(request.user, request.GET.get("sort") or None, filters, offset=(max(number, 1) - 1) * RUNS_PER_PAGE, limit=RUNS_PER_PAGE)
    except ValueError as exc:
        return base_views._error_page(request, 400, f"sort: {exc}")
    page = _page_of(request, table.count)
    if page["offset"] != table.offset:  # past the last page: show the last one
        table = leaderboard_page(request.user, table.sort, filters, offset=page["offset"], limit=RUNS_PER_PAGE)
    sort = table.sort
    key = sort.lstrip("-")
    # A column no listed run (on any page) has a figure in is left out (a run without AIME says
    # nothing there), unless it is the one sorted by.
    columns = [
        {"key": column, "label": label, "title": title, "shown_as": shown_as, "active": column == key, "descending": sort.startswith("-"),
         "next": (column if sort.startswith("-") else f"-{column}") if column == key else (column if column == "wall_time_s" else f"-{column}")}
        for column, label, title, shown_as in base_views.LEADERBOARD_COLUMNS
        if column == key or table.present.get(column)
    ]
    try:
        target = Target.parse(request.GET.get("target"))
    except ValueError as exc:
        return base_views._error_page(request, 400, str(exc))
    # Time to target for this page's rows and their sweeps only (a few queries): it depends on the
    # target the user sets, so it is not a stored figure to sort by.
    reached, sweeps = group_compare.leaderboard_sweeps(request.user, [row["run_id"] for row in table.rows], target)
    rows = [{**row, "to_target": reached.get(row["run_id"])} for row in table.rows]
    query = filters.query_string()
    if target.text != DEFAULT_TARGET:
        query = f"{query}&target={target.text}" if query else f"target={target.text}"
    pager_query = f"sort={sort}&{query}" if query else f"sort={sort}"
    return render(request, "inflight/leaderboard.html", {
        "rows": rows, "sweeps": sweeps, "target": target, "columns": columns, "sort": sort, "filters": filters, "filter_query": query,
        "tags": all_tags(runs_visible_to(request.user)), "statuses": Run._meta.get_field("status").choices,
        "page": _pager_links(page, pager_query),
    })
