"""The leaderboard's per-run summaries (inflight.runs.summaries) and the pages and API that list
runs a page at a time, on the real PostgreSQL. A few dozen runs here; the 2,000-run figures are
measured by bench/platform_scale.py."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from django.urls import reverse

from inflight.runs import evaluations, selectors, services
from inflight.runs.actions import supersede_rewound_history
from inflight.runs.models import MetricPoint, Run, RunSummary
from inflight.live.ingest import PointIn
from inflight.runs.summaries import HELDOUT_METRIC, RECENT_TRAIN_STEPS, SUCCESS_METRIC, THROUGHPUT_METRIC, refresh_summaries
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db

EVAL = {"t": 1.0, "k": 4, "pass_at_k": 0.5, "num_problems": 2, "num_samples": 8, "policy_versions": []}


def reference_figures(run: Run) -> dict[str, Any]:
    """The figures as the leaderboard computed them before summaries: from every point."""
    def series(name: str) -> list[tuple[int, float]]:
        return list(MetricPoint.objects.filter(run=run, name=name).order_by("step", "line").values_list("step", "value"))

    out: dict[str, Any] = {}
    for key, name in (("heldout", HELDOUT_METRIC), ("success", SUCCESS_METRIC)):
        pairs = series(name)
        out[f"{key}_best"] = max(v for _, v in pairs) if pairs else None
        out[f"{key}_last"] = pairs[-1][1] if pairs else None
    by_step = dict(series(SUCCESS_METRIC))
    recent = [by_step[s] for s in sorted(by_step)[-RECENT_TRAIN_STEPS:]]
    out["success_recent"] = sum(recent) / len(recent) if recent else None
    tokens = [v for _, v in series(THROUGHPUT_METRIC)]
    out["throughput"] = sum(tokens) / len(tokens) if tokens else None
    for bench in ("aime24", "math500"):
        scores = list(run.eval_scores.filter(benchmark=bench).order_by("step").values_list("mean_at_k", flat=True))
        out[f"{bench}_best"], out[f"{bench}_last"] = (max(scores), scores[-1]) if scores else (None, None)
    return out


def row_of(user, run: Run) -> dict[str, Any]:
    return next(row for row in selectors.leaderboard(user)[0] if row["run_id"] == run.pk)


def assert_matches_reference(user, run: Run) -> None:
    row, expected = row_of(user, run), reference_figures(run)
    for key, value in expected.items():
        if key == "throughput" and value is not None:
            assert row[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert row[key] == value, (key, row[key], value)


def test_a_live_run_is_summarised_incrementally_and_exactly(owner) -> None:
    """Batches arrive between reads; each read folds in only the new points (seq after the
    summary's) and must equal a computation from every point: a step logged again by a later
    line wins, the recent mean covers the last 10 distinct steps, best is over everything."""
    rng = random.Random(7)
    run = services.create_run(owner, "live", {})
    line = 0
    for batch in range(12):
        points = []
        for step in range(batch * 4, batch * 4 + 4):
            for name in (SUCCESS_METRIC, THROUGHPUT_METRIC) + ((HELDOUT_METRIC,) if step % 3 == 0 else ()):
                points.append(PointIn(line=line, name=name, step=step, t=float(step), value=rng.random()))
            line += 1
        if batch % 4 == 3:  # a step logged again later (a resumed engine): its later line wins
            points.append(PointIn(line=line, name=SUCCESS_METRIC, step=batch * 4 - 2, t=0.0, value=rng.random()))
            line += 1
        live_ingest.ingest_metrics(run.pk, points)
        if batch % 3 == 1:
            evaluations.ingest_eval(run.pk, {**EVAL, "benchmark": "aime24", "step": batch, "mean_at_k": rng.random()}, [])
        assert_matches_reference(owner, run)
        summary = RunSummary.objects.get(run=run)
        assert summary.metrics_seq == Run.objects.get(pk=run.pk).metrics_seq
    # Nothing new: nothing is computed again.
    assert refresh_summaries(Run.objects.filter(pk=run.pk)) == 0
    # A re-sent evaluation that changed its figure (same count of evaluations) is seen.
    evaluations.ingest_eval(run.pk, {**EVAL, "t": 5.0, "benchmark": "aime24", "step": 10, "mean_at_k": 0.999}, [])
    assert refresh_summaries(Run.objects.filter(pk=run.pk)) == 1
    assert row_of(owner, run)["aime24_best"] == 0.999 and row_of(owner, run)["aime24_last"] == 0.999


def test_a_rewound_resume_drops_the_summary(owner) -> None:
    run = services.create_run(owner, "rewound", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(line=i, name=SUCCESS_METRIC, step=i, t=float(i), value=v) for i, v in enumerate([0.1, 0.9, 0.5])])
    assert row_of(owner, run)["success_best"] == 0.9
    # The resumed engine restarts from step 0's checkpoint: steps 1-2 of the dead attempt go.
    assert supersede_rewound_history(run.pk, step=0, metrics_lines=3, resumed_t=10.0) == 2
    live_ingest.ingest_metrics(run.pk, [PointIn(line=3, name=SUCCESS_METRIC, step=1, t=11.0, value=0.3)])
    row = row_of(owner, run)
    assert (row["success_best"], row["success_last"]) == (0.3, 0.3)
    assert_matches_reference(owner, run)


def _many_runs(owner, count: int) -> list[Run]:
    runs = Run.objects.bulk_create([Run(owner=owner, name=f"run-{i:02d}", config={"mode": "async", "trainer": {"max_steps": 10}}, status="succeeded",
                                        tags=["sweep"] if i % 2 else []) for i in range(count)])
    for i, run in enumerate(runs):
        live_ingest.ingest_metrics(run.pk, [PointIn(line=0, name=SUCCESS_METRIC, step=1, t=1.0, value=i / 100)])
    return runs


def test_the_leaderboard_pages_are_sorted_over_every_run(owner, owner_web, owner_api, other_user) -> None:
    runs = _many_runs(owner, 55)
    _many_runs(other_user, 3)  # not the owner's: on no page, in no count
    answer = owner_api.get("/api/leaderboard/?sort=-success_best&limit=20&offset=40").json()
    assert answer["count"] == 55 and answer["limit"] == 20 and answer["offset"] == 40 and answer["next"] is None
    assert [row["run_id"] for row in answer["rows"]] == [run.pk for run in reversed(runs[:15])]
    assert "offset=20" in answer["previous"] and "sort=-success_best" in answer["previous"]
    first = owner_api.get("/api/leaderboard/?sort=-success_best&limit=20").json()
    assert [row["success_best"] for row in first["rows"]] == [i / 100 for i in range(54, 34, -1)] and "offset=20" in first["next"]
    assert owner_api.get("/api/leaderboard/?limit=0").status_code == 400
    assert owner_api.get("/api/leaderboard/?limit=1001").status_code == 400

    page = owner_web.get(reverse("web:leaderboard") + "?tag=sweep&sort=success_best").content.decode()
    ids = [int(i) for i in re.findall(r'<tr data-run-id="(\d+)"', page)]
    assert ids == [run.pk for run in runs if run.tags][:50] and len(ids) == 27
    assert 'id="pager"' not in page  # one page: no pager
    page = owner_web.get(reverse("web:leaderboard") + "?sort=success_best&page=2").content.decode()
    assert [int(i) for i in re.findall(r'<tr data-run-id="(\d+)"', page)] == [run.pk for run in runs[50:]]
    assert "51–55 of 55" in page and 'href="?sort=success_best&amp;page=1" rel="prev"' in page
    # Past the end: the last page.
    assert "51–55 of 55" in owner_web.get(reverse("web:leaderboard") + "?sort=success_best&page=9").content.decode()


def test_the_run_list_is_paged_and_its_links_keep_filters_and_sort(owner, owner_web) -> None:
    runs = _many_runs(owner, 60)
    page = owner_web.get(reverse("web:run_list") + "?sort=name").content.decode()
    ids = [int(i) for i in re.findall(r'<tr data-run-id="(\d+)"', page)]
    assert ids == [run.pk for run in runs[:50]]
    assert "1–50 of 60" in page and 'href="?sort=name&amp;page=2" rel="next"' in page
    page = owner_web.get(reverse("web:run_list") + "?sort=name&page=2").content.decode()
    assert [int(i) for i in re.findall(r'<tr data-run-id="(\d+)"', page)] == [run.pk for run in runs[50:]]
    assert 'href="?sort=name&amp;page=1" rel="prev"' in page and 'rel="next"' not in page
    page = owner_web.get(reverse("web:run_list") + "?tag=sweep&sort=-name&page=x").content.decode()
    assert [int(i) for i in re.findall(r'<tr data-run-id="(\d+)"', page)] == [run.pk for run in reversed(runs) if run.tags]
    assert 'id="pager"' not in page


def test_tag_suggestions_are_every_tag_of_the_visible_runs(owner, other_user) -> None:
    from inflight.runs.run_filters import all_tags

    Run.objects.bulk_create([
        Run(owner=owner, name="a", config={}, tags=["b-tag", "a-tag"]), Run(owner=owner, name="b", config={}, tags=["a-tag"]),
        Run(owner=owner, name="c", config={}), Run(owner=other_user, name="d", config={}, tags=["theirs"]),
    ])
    assert all_tags(selectors.runs_visible_to(owner)) == ["a-tag", "b-tag"]
    assert all_tags(Run.objects.none()) == []


def test_a_run_deleted_while_its_summary_is_computed_is_left_out(owner, monkeypatch: pytest.MonkeyPatch) -> None:
    from inflight.runs import summaries

    kept, gone = services.create_run(owner, "kept", {}), services.create_run(owner, "gone", {})
    real = summaries._refresh_batch

    def delete_then_refresh(stale):  # the delete lands between reading the runs and writing their rows
        Run.objects.filter(pk=gone.pk).delete()
        real(stale)

    monkeypatch.setattr(summaries, "_refresh_batch", delete_then_refresh)
    assert refresh_summaries(Run.objects.filter(owner=owner)) == 2
    assert list(RunSummary.objects.values_list("run_id", flat=True)) == [kept.pk]


@pytest.mark.django_db(transaction=True)
def test_two_readers_at_once_compute_the_summaries_once(owner) -> None:
    import threading

    from django.db import connection

    _many_runs(owner, 6)
    start, written = threading.Barrier(2), []

    def read() -> None:
        try:
            start.wait()
            written.append(refresh_summaries(Run.objects.all()))
        finally:
            connection.close()

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(written) == [0, 6]  # the second waited for the first, then found them done
    assert RunSummary.objects.count() == 6
