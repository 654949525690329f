"""The finished-runs half of bench/platform_scale.py: thousands of finished runs in PostgreSQL, then
the run list, the leaderboard, a 20-run compare, a compare of five sweeps (20 runs as groups with
bands) and a run's Timeline tab timed, and the compare page in Chromium. The leaderboard answers
from per-run summaries (inflight.runs.summaries): its first read, which computes them all, is timed
apart, and so is a read after 200 runs each stored a new batch.

Half the clones are put in sweeps of four (2 learning rates x 2 seeds, as `inflight sweep` stores
them: a RunGroup, each run pointing to it with its grid point), so the run list pages are timed as
a lab's look, with sweep rows among single runs. The Timeline run is given the demo run's own
`timeline/` lanes in a run directory private to the bench.

The database is filled fast and with the platform's own shapes: ONE template run is stored
through the real ingest services (`ingest_metrics` with its folding into the snapshot buckets,
`ingest_eval` with per-problem rows, `ingest_rollouts` from a real demo run's stream), then cloned
in SQL (`INSERT ... SELECT` over every table that holds a run's rows) with values varied per clone
(scaled by 1 + (id % 97) / 1000, which keeps every bucket's min <= last <= max order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPARED_RUNS = 20
SWEEP_SIZE = 4  # 2 learning rates x 2 seeds per sweep
SWEEP_POINTS = [{"trainer.lr": lr, "seed": seed} for lr in (1e-4, 3e-4) for seed in (0, 1)]
COMPARED_SWEEPS = COMPARED_RUNS // SWEEP_SIZE  # the group compare holds as many runs as the runs compare
# static/inflight/compare.js's DEFAULTS: what the compare page charts when the address names no metrics.
COMPARE_DEFAULT_METRICS = ("success/mean", "reward/mean", "success/heldout", "rollout/tokens_per_s", "policy_lag/max")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def _template_run(user: Any, steps: int, metrics: int, demo: Path) -> Any:
    import yaml

    from inflight.rollouts.services import ingest_rollouts
    from inflight.rollouts.tokens import decoder_for_model
    from inflight.live import broadcast
    from inflight.live import ingest as live_ingest
    from inflight.runs import evaluations, services
    from inflight.runs.models import Run, RunStatus

    config = yaml.safe_load((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text())
    run = services.create_run(user, "finished", config)
    demo_names: list[str] = []
    metrics_file = demo / "metrics.jsonl"
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            for key, value in json.loads(line).items():
                if key not in ("t", "step") and isinstance(value, (int, float)) and key not in demo_names:
                    demo_names.append(key)
    names = (demo_names + [f"extra/{i:02d}" for i in range(metrics)])[:metrics]
    t0 = time.time() - steps
    for first in range(0, steps, 10):  # the worker's batches: a few lines per poll
        live_ingest.ingest_metrics(run.pk, [
            live_ingest.PointIn(line=step, name=name, step=step, t=t0 + step, value=((step * 7919 + i * 104729) % 1000) / 1000.0 + step / steps)
            for step in range(first, min(steps, first + 10)) for i, name in enumerate(names)
        ])
    results = sorted((demo / "eval").glob("*heldout*.jsonl")) if (demo / "eval").is_dir() else []
    problem_rows = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()] if results else []
    for step in range(0, steps, 20):
        evaluations.ingest_eval(run.pk, {"t": t0 + step, "step": step, "benchmark": "heldout", "k": 4, "mean_at_k": 0.4 + step / (3 * steps), "pass_at_k": 0.9,
                                      "stderr": 0.03, "num_problems": len(problem_rows), "num_samples": 4 * len(problem_rows), "policy_versions": [step],
                                      "results_file": ""}, problem_rows)
    stream = demo / "stream" / "rollouts.jsonl"
    if stream.exists():
        lines = [json.loads(line) for line in stream.read_text().splitlines()[:steps * 64] if line.strip()]
        for first in range(0, len(lines), 2000):
            ingest_rollouts(run.pk, list(enumerate(lines))[first:first + 2000], decoder_for_model(str(REPO_ROOT / "var" / "models" / "tiny")))
    broadcast.flush_broadcasts()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    return Run.objects.get(pk=run.pk), len(names)


def _columns(cursor: Any, table: str) -> list[str]:
    from django.db import connection

    return [column.name for column in connection.introspection.get_table_description(cursor, table)]


def clone_runs(template_id: int, copies: int) -> dict[str, int]:
    """`copies` clones of the template run and all its rows; returns rows added per table."""
    from django.apps import apps
    from django.db import connection, transaction

    from inflight.runs.models import EvalProblemResult, EvalScore, Run

    varied = {"value": "t.value * (1 + (m.id %% 97) / 1000.0)", "min_value": "t.min_value * (1 + (m.id %% 97) / 1000.0)",
              "max_value": "t.max_value * (1 + (m.id %% 97) / 1000.0)", "last_value": "t.last_value * (1 + (m.id %% 97) / 1000.0)",
              "mean_at_k": "t.mean_at_k * (0.8 + (m.id %% 97) / 300.0)"}
    added: dict[str, int] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        runs = Run._meta.db_table
        columns = [c for c in _columns(cursor, runs) if c != "id"]
        special = {"name": "'finished-' || g", "created_at": "now() - g * interval '1 minute'",
                   "started_at": "now() - g * interval '1 minute' - interval '5 minutes'", "finished_at": "now() - g * interval '1 minute'",
                   "status": "CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'succeeded' END", "tags": "jsonb_build_array('sweep-' || (g %% 5))"}
        select = ", ".join(special.get(c, f"t.{c}") for c in columns)
        cursor.execute("CREATE TEMP TABLE clone_map (id bigint PRIMARY KEY) ON COMMIT DROP")
        cursor.execute(f"WITH made AS (INSERT INTO {runs} ({', '.join(columns)}) SELECT {select} FROM {runs} t, generate_series(1, %s) g "
                       f"WHERE t.id = %s RETURNING id) INSERT INTO clone_map SELECT id FROM made", [copies, template_id])
        added[runs] = cursor.rowcount
        for model in apps.get_models():
            run_fields = [f for f in model._meta.concrete_fields if f.is_relation and f.related_model is Run and f.name == "run"]
            # A run's leaderboard summary is computed from its own rows when first read, not copied.
            if not run_fields or model is Run or model._meta.model_name == "runsummary":
                continue
            table = model._meta.db_table
            columns = [c for c in _columns(cursor, table) if not (c == "id" and not model._meta.pk.name == "run")]
            select = ", ".join("m.id" if c == "run_id" else varied.get(c, f"t.{c}") for c in columns)
            cursor.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table} t CROSS JOIN clone_map m WHERE t.run_id = %s", [template_id])
            added[table] = cursor.rowcount
        scores, problems = EvalScore._meta.db_table, EvalProblemResult._meta.db_table
        columns = [c for c in _columns(cursor, problems) if c not in ("id", "eval_id")]
        cursor.execute(
            f"INSERT INTO {problems} ({', '.join(columns)}, eval_id) SELECT {', '.join('p.' + c for c in columns)}, new.id FROM {problems} p "
            f"JOIN {scores} old ON old.id = p.eval_id JOIN {scores} new ON new.benchmark = old.benchmark AND new.step = old.step "
            f"JOIN clone_map m ON m.id = new.run_id WHERE old.run_id = %s", [template_id])
        added[problems] = cursor.rowcount
    with connection.cursor() as cursor:
        # As autovacuum leaves finished runs' tables: statistics and the visibility map (index-only scans).
        cursor.execute("VACUUM ANALYZE")
    return added


def make_sweeps(user: Any, run_ids: list[int]) -> list[int]:
    """`run_ids` (oldest first) put in sweeps of SWEEP_SIZE as inflight.runs.sweeps stores them: a
    RunGroup per sweep, each run pointing to it with its grid point; the sweeps' ids, oldest first."""
    from django.db import connection, transaction

    from inflight.runs.models import Run, RunGroup

    count = len(run_ids) // SWEEP_SIZE
    base = Run.objects.get(pk=run_ids[0]).config
    with transaction.atomic():
        groups = RunGroup.objects.bulk_create([
            RunGroup(owner=user, name=f"lr-sweep-{index}", base_config=base, grid={"trainer.lr": [1e-4, 3e-4]}, seeds=[0, 1])
            for index in range(count)])
        members = [(run_id, groups[index // SWEEP_SIZE].pk, json.dumps(SWEEP_POINTS[index % SWEEP_SIZE]))
                   for index, run_id in enumerate(run_ids[:count * SWEEP_SIZE])]
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Run._meta.db_table} r SET group_id = v.g, group_point = v.p::jsonb "
                           "FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS v(id, g, p) WHERE r.id = v.id",
                           [[m[0] for m in members], [m[1] for m in members], [m[2] for m in members]])
    return [group.pk for group in groups]


def give_timeline(run_id: int, demo: Path) -> int:
    """The demo run's `timeline/` lanes copied into run `run_id`'s directory (INFLIGHT_RUNS_DIR,
    private to this bench): the spans the Timeline tab reads; their count."""
    import shutil

    from inflight.runs import run_paths

    target = run_paths.run_dir(run_id) / "timeline"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(demo / "timeline", target)
    return sum(len(path.read_text().splitlines()) for path in target.glob("*.jsonl"))


def _page_data(response: Any) -> dict[str, Any]:
    return json.loads(response.content.decode().split('<script id="page-data" type="application/json">', 1)[1].split("</script>", 1)[0])


def _timed_compare(client: Any, url: str, repeats: int) -> list[float]:
    """ms of a compare as a browser makes it: the page, then every run's snapshot in one request
    (compare.js's first load, compare/snapshots.json; it fetches the charted metrics only: with no
    `metrics` in the address, those of its DEFAULTS the runs logged, else the first name)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        response = client.get(url)
        assert response.status_code == 200, f"{url}: HTTP {response.status_code}"
        page = _page_data(response)
        charted = [name for name in page["metric_names"] if name in COMPARE_DEFAULT_METRICS] or page["metric_names"][:1]
        runs = ",".join(str(run["id"]) for run in page["runs"])
        snapshots = client.get(page["snapshots_url"], {"runs": runs, "names": ",".join(charted)})
        times.append((time.perf_counter() - start) * 1000)  # server time: the answer is parsed after (1.3 MB at 20 runs)
        assert snapshots.status_code == 200 and len(snapshots.json()["snapshots"]) == len(page["runs"])
    return times


def _timed_timeline(client: Any, run_id: int, repeats: int) -> tuple[list[float], int]:
    """ms of opening a run's Timeline tab: the run page, then its timeline.json (every lane from
    the start, as the tab's first fetch); the spans the last answer held."""
    times, spans = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        assert client.get(f"/runs/{run_id}/").status_code == 200
        response = client.get(f"/runs/{run_id}/timeline.json")
        assert response.status_code == 200, f"timeline.json: HTTP {response.status_code}"
        spans = len(response.json()["spans"])
        times.append((time.perf_counter() - start) * 1000)
    return times, spans


def _timed_get(client: Any, url: str, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        response = client.get(url)
        elapsed = (time.perf_counter() - start) * 1000
        assert response.status_code == 200, f"{url}: HTTP {response.status_code} {response.content[:300]!r}"
        times.append(elapsed)
    return times


# Runs taken as live for the leaderboard's catch-up timing (platform_scale's live phase runs 200).
LIVE_RUNS_AT_ONCE = 200


def leaderboard_catch_up(client: Any, live: int, steps: int) -> float:
    """ms of a leaderboard read right after `live` runs each stored one more batch (5 steps of
    every metric, as ingest leaves them: points with the run's next metrics_seq): the summaries
    of those runs take in only the new points. Done in a transaction rolled back after."""
    from django.db import connection, transaction

    from inflight.runs.models import MetricPoint, Run

    _timed_get(client, "/leaderboard/", 1)  # every summary up to date first
    ids = list(Run.objects.filter(name__startswith="finished").order_by("-id").values_list("pk", flat=True)[:live])
    points = MetricPoint._meta.db_table

    class Undo(Exception):
        pass

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Run._meta.db_table} SET metrics_seq = metrics_seq + 1 WHERE id = ANY(%s)", [ids])
            cursor.execute(
                f"INSERT INTO {points} (run_id, name, step, t, value, line, seq) SELECT p.run_id, p.name, p.step + 1000, p.t + 1000, p.value, "
                f"p.line + 1000000, r.metrics_seq FROM {points} p JOIN {Run._meta.db_table} r ON r.id = p.run_id "
                f"WHERE p.run_id = ANY(%s) AND p.step >= %s", [ids, steps - 5])
            added = cursor.rowcount
            ms = _timed_get(client, "/leaderboard/", 1)[0]
            raise Undo
    except Undo:
        pass
    print(f"[finished] leaderboard read after {len(ids)} runs stored a batch each ({added} points): {ms:.0f} ms")
    return round(ms, 1)


def compare_in_browser(base: str, url: str, loads: int) -> list[float]:
    """ms from navigation start until every chosen metric's chart is drawn, per page load."""
    from playwright.sync_api import sync_playwright

    chromium = Path("/usr/bin/chromium")
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]
    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=args)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(f"{base}/accounts/login/")
            page.fill("#id_username", "bench")
            page.fill("#id_password", "bench-password-1")
            page.click("button[type=submit]")
            page.wait_for_load_state()
            for _ in range(loads):
                page.goto(base + url)
                page.wait_for_function(
                    "() => { const s = document.getElementById('metric-select'); const n = s ? s.selectedOptions.length : 0;"
                    " return n > 0 && document.querySelectorAll('#charts .js-plotly-plot .main-svg').length >= n; }")
                times.append(page.evaluate("performance.now()"))
        finally:
            browser.close()
    return times


def finished_runs_phase(args: argparse.Namespace, user: Any, client: Any, folder: Path, processes: Any, start_web_node: Any) -> dict[str, Any]:
    """`processes`/`start_web_node`: platform_scale's process holder and Daphne starter."""
    from django.db import connection
    from django.test import override_settings

    from inflight.runs.models import Run, RunGroup

    started = time.perf_counter()
    have = Run.objects.filter(name__startswith="finished").count()
    names = args.metrics
    added: dict[str, int] = {}
    if have < args.finished_runs:  # a kept database (--db-dir) is loaded once
        template, names = _template_run(user, args.steps, args.metrics, Path(args.demo_run))
        added = clone_runs(template.pk, args.finished_runs - have - 1)
    if not RunGroup.objects.filter(owner=user).exists():  # also a database kept from before sweeps were timed
        finished_ids = list(Run.objects.filter(name__startswith="finished").order_by("id").values_list("pk", flat=True))
        added["sweeps"] = len(make_sweeps(user, finished_ids[: max(SWEEP_SIZE, len(finished_ids) // 2)]))
    load_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        if not added:
            cursor.execute("VACUUM ANALYZE")  # a kept database after a migration rebuilt an index
        cursor.execute("SELECT pg_database_size(current_database())")
        db_bytes = cursor.fetchone()[0]
        cursor.execute("SELECT relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY 2 DESC LIMIT 6")
        biggest = cursor.fetchall()
    finished = Run.objects.filter(name__startswith="finished").count()
    print(f"[finished] {finished} runs ({args.steps} steps x {names} metrics each) loaded in {load_s:.0f} s: "
          + ", ".join(f"{table} +{rows}" for table, rows in added.items()))
    print(f"[finished] database {db_bytes / 1e6:.0f} MB = {db_bytes / finished / 1e3:.0f} kB per run; biggest tables: "
          + ", ".join(f"{name} {size / 1e6:.0f} MB" for name, size in biggest))
    ids = list(Run.objects.filter(name__startswith="finished").order_by("-id").values_list("pk", flat=True)[:COMPARED_RUNS])
    # The leaderboard's first read computes every run's summary (inflight.runs.summaries), once:
    # timed apart, from none, then the pages read them.
    from inflight.runs.models import RunSummary

    RunSummary.objects.all().delete()
    cold_ms = _timed_get(client, "/leaderboard/", 1)[0]
    out_cold = {"leaderboard_first_read_ms": round(cold_ms, 1)}
    print(f"[finished] leaderboard's first read (summarising {finished} runs): {cold_ms:.0f} ms")
    views = {
        "run_list": ["/", "/?status=succeeded&sort=-created", "/?q=finished-1&sort=name", "/?tag=sweep-3&sort=-started", "/?sort=status", "/?page=20&sort=name"],
        "run_list_api_page": ["/api/runs/?limit=50&offset=1000", "/api/runs/?status=failed&sort=name&limit=100&offset=100"],
        # Sorted by a figure column (issue 33: in the database, runs.run_filters.METRIC_SORT_KEYS).
        "run_list_by_figure": ["/?sort=-heldout", "/?sort=loss", "/?sort=-progress&status=succeeded", "/?sort=-wall&page=20"],
        "leaderboard": ["/leaderboard/", "/leaderboard/?status=succeeded&sort=-heldout_best", "/leaderboard/?page=30&sort=name",
                        "/api/leaderboard/?limit=200&offset=1000&sort=-throughput"],
        "compare_page": [f"/compare/?runs={','.join(map(str, ids))}"],
    }
    out: dict[str, Any] = {"finished_runs": finished, "db_kb_per_run": round(db_bytes / finished / 1e3, 1), "finished_load_s": round(load_s, 1), **out_cold}
    for key, urls in views.items():
        times = [ms for url in urls for ms in _timed_get(client, url, args.repeats)]
        out[f"{key}_p95_ms"] = round(_p95(times), 1)
        print(f"[finished] {key}: p50 {statistics.median(times):.0f} ms, p95 {_p95(times):.0f} ms over {len(times)} requests ({', '.join(urls)})")
    # A compare is the page and one request for its runs' snapshots (what compare.js fetches).
    compare_times = _timed_compare(client, views["compare_page"][0], args.repeats)
    out["compare_20_runs_p95_ms"] = round(_p95(compare_times), 1)
    # Five sweeps compared as groups (each a mean with a band over its runs, time to target per group).
    sweep_ids = list(RunGroup.objects.filter(owner=user).order_by("-id").values_list("pk", flat=True)[:COMPARED_SWEEPS])
    group_url = f"/compare/?groups={','.join(map(str, sweep_ids))}&band=sd"
    group_times = _timed_compare(client, group_url, args.repeats)
    out["group_compare_p95_ms"] = round(_p95(group_times), 1)
    print(f"[finished] compare of {len(sweep_ids)} sweeps as groups (page + the runs' snapshots, {group_url}): "
          f"p50 {statistics.median(group_times):.0f} ms, p95 {_p95(group_times):.0f} ms")
    # A run's Timeline tab, the run private to this bench's run directory.
    with override_settings(INFLIGHT_RUNS_DIR=folder / "runs"):
        lines = give_timeline(ids[0], Path(args.demo_run))
        timeline_times, spans = _timed_timeline(client, ids[0], args.repeats)
    assert spans == lines, f"timeline.json answered {spans} spans of the {lines} the run's lanes hold"
    out["timeline_p95_ms"] = round(_p95(timeline_times), 1)
    print(f"[finished] Timeline tab of run {ids[0]} (the run page + timeline.json, {spans} spans of the demo run): "
          f"p50 {statistics.median(timeline_times):.0f} ms, p95 {_p95(timeline_times):.0f} ms")
    out["run_list_p95_ms"] = max(out["run_list_p95_ms"], out["run_list_api_page_p95_ms"], out["run_list_by_figure_p95_ms"])
    out["leaderboard_2000_runs_p95_ms" if args.finished_runs == 2000 else f"leaderboard_{args.finished_runs}_runs_p95_ms"] = out.pop("leaderboard_p95_ms")
    print(f"[finished] compare of {len(ids)} runs (page + their {len(ids)} snapshots in one request): p50 {statistics.median(compare_times):.0f} ms, p95 {_p95(compare_times):.0f} ms")
    out["leaderboard_live_catch_up_ms"] = leaderboard_catch_up(client, LIVE_RUNS_AT_ONCE, args.steps)
    try:
        base = start_web_node(processes, "web-browser")
        browser_ms = compare_in_browser(base, views["compare_page"][0], loads=args.browser_loads)
    finally:
        processes.stop_all()
    print(f"[finished] compare page in Chromium, charts drawn after: {', '.join(f'{ms:.0f}' for ms in browser_ms)} ms")
    out["compare_page_interactive_ms"] = round(max(browser_ms), 1)  # the first load included (a cold browser cache)
    out["compare_page_interactive_median_ms"] = round(statistics.median(browser_ms), 1)
    return out
