"""Issue 33, reproducibility: what ran a run (code version, packages, host, exact command) is
recorded by the engine (rl_core/launch/provenance.py), stored by the worker once the run is running,
shown on the run page and diffed between runs on compare."""

from __future__ import annotations

import json

import pytest

from inflight.provenance.models import RunProvenance
from inflight.runs import run_paths
from inflight.runs.models import Run
from rl_core.launch.provenance import record_launch
from rl_core.rundir.layout import PROVENANCE_FILE
from workers.tasks import PlatformReporter

pytestmark = pytest.mark.django_db(transaction=True)


def launched(owner, name: str, resumes: int = 0) -> Run:
    run = Run.objects.create(owner=owner, name=name, config={}, status="starting")
    folder = run_paths.run_dir(run.pk)
    folder.mkdir(parents=True)
    for attempt in range(resumes + 1):
        record_launch(folder, resume=attempt > 0)
    return run


def test_the_worker_stores_it_when_the_run_runs_and_the_page_shows_it(owner, owner_web, other_web) -> None:
    run = launched(owner, "first", resumes=1)
    assert "Not recorded yet" in owner_web.get(f"/runs/{run.pk}/").content.decode()
    PlatformReporter(run.pk).running(12345)
    run.refresh_from_db()
    assert run.status == "running" and len(RunProvenance.objects.get(run=run).launches) == 2
    page = owner_web.get(f"/runs/{run.pk}/").content.decode()
    record = json.loads((run_paths.run_dir(run.pk) / PROVENANCE_FILE).read_text().splitlines()[-1])
    assert record["code"]["git_commit"][:12] in page and record["host"]["hostname"] in page
    assert f"pydantic=={record['packages']['pydantic']}" in page and "2 (the first and 1 resume" in page
    assert "rl_core" in page  # the command line
    assert other_web.get(f"/runs/{run.pk}/").status_code == 404


def test_compare_shows_only_what_differs(owner, owner_web) -> None:
    same_a, same_b, changed = launched(owner, "a"), launched(owner, "b"), launched(owner, "c")
    for run in (same_a, same_b, changed):
        PlatformReporter(run.pk).running(1)
    stored = RunProvenance.objects.get(run=changed)
    stored.launches[-1]["packages"]["torch"] = "0.0.1-test"
    stored.launches[-1]["host"]["hostname"] = "elsewhere"
    stored.save()
    alike = owner_web.get(f"/compare/?runs={same_a.pk},{same_b.pk}").content.decode()
    assert 'id="provenance-same"' in alike
    differ = owner_web.get(f"/compare/?runs={same_a.pk},{changed.pk}").content.decode()
    assert 'data-package="torch"' in differ and "0.0.1-test" in differ and "elsewhere" in differ
    assert 'data-package="pydantic"' not in differ
    fresh = Run.objects.create(owner=owner, name="fresh", config={}, status="queued")
    partial = owner_web.get(f"/compare/?runs={same_a.pk},{fresh.pk}").content.decode()
    assert f"Not recorded yet: #{fresh.pk} fresh" in partial
