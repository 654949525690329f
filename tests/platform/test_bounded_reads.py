"""What pages read stays bounded and cheap however many runs and points there are (issue 24; the
timings at 2,000 runs are bench/platform_scale.py's): the run list's triage cells come from one
array per run and metric built in PostgreSQL, a snapshot's buckets are read by an index-only scan,
and a compare takes 20 runs but not more than MAX_COMPARED_RUNS."""

from __future__ import annotations
from inflight.live import ingest as live_ingest

import time
from typing import Any

import pytest

pytestmark = pytest.mark.django_db


def _run_with_steps(owner: Any, tiny_config: dict, steps: int, names: list[str]) -> Any:
    from inflight.runs import services

    run = services.create_run(owner, "long", tiny_config)
    for first in range(0, steps, 100):
        live_ingest.ingest_metrics(run.pk, [
            live_ingest.PointIn(line=step, name=name, step=step, t=1_700_000_000.0 + step, value=float((step * 31 + i) % 97))
            for step in range(first, min(steps, first + 100)) for i, name in enumerate(names)
        ])
    return run


def test_triage_cells_are_the_last_bucket_and_a_thinned_sparkline(owner: Any, tiny_config: dict) -> None:
    from inflight.live.models import SnapshotBucket
    from inflight.web.selectors import SPARKLINE_METRICS, SPARKLINE_POINTS, TRIAGE_METRICS, _thin, triage

    names = sorted({metric for metric, _, _ in TRIAGE_METRICS.values()} | set(SPARKLINE_METRICS))
    runs = [_run_with_steps(owner, tiny_config, 300, names), _run_with_steps(owner, tiny_config, 7, names[:2])]
    cells = triage(runs)
    for run in runs:
        for key, (metric, _, _) in TRIAGE_METRICS.items():
            values = list(SnapshotBucket.objects.filter(run=run, name=metric).order_by("bucket").values_list("last_value", flat=True))
            assert cells[run.pk]["latest"][key] == (values[-1] if values else None), (run.name, key)
        for metric in SPARKLINE_METRICS:
            values = list(SnapshotBucket.objects.filter(run=run, name=metric).order_by("bucket").values_list("last_value", flat=True))
            assert cells[run.pk]["sparklines"][metric] == _thin(values)
            assert len(cells[run.pk]["sparklines"][metric]) <= SPARKLINE_POINTS
    assert cells[runs[0].pk]["step"] == 299


def test_a_snapshot_reads_its_buckets_by_an_index_only_scan(owner: Any, tiny_config: dict) -> None:
    """The buckets of one run are scattered over the table (written as its steps come, among other
    runs'): read through the heap, a compare of 20 runs touched ~one page per bucket."""
    from django.db import connection

    from inflight.live.selectors import _STORED_ROWS

    run = _run_with_steps(owner, tiny_config, 50, ["a", "b"])
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE live_snapshotbucket") if not connection.in_atomic_block else None
        cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off")  # the plan a large table gets
        cursor.execute("EXPLAIN " + _STORED_ROWS.format(name_filter=""), {"run": run.pk})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Only Scan" in plan, plan


def test_compare_takes_twenty_runs_not_more_than_the_limit(owner: Any, owner_web: Any, tiny_config: dict) -> None:
    from inflight.runs import services
    from inflight.runs.models import Run
    from inflight.web.views import MAX_COMPARED_RUNS

    template = services.create_run(owner, "c", tiny_config)
    Run.objects.bulk_create([Run(owner=owner, name=f"c{n}", config=template.config) for n in range(MAX_COMPARED_RUNS)])
    ids = list(Run.objects.filter(owner=owner).values_list("pk", flat=True))
    started = time.perf_counter()
    assert owner_web.get(f"/compare/?runs={','.join(map(str, ids[:20]))}").status_code == 200
    assert time.perf_counter() - started < 30
    response = owner_web.get(f"/compare/?runs={','.join(map(str, ids[:MAX_COMPARED_RUNS + 1]))}")
    assert response.status_code == 400 and f"at most {MAX_COMPARED_RUNS}" in response.content.decode()
