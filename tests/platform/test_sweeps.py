"""Sweeps (issue 35 §2): a group of runs over a grid and seeds, queued whole or refused whole; the
run list's sweep row; compare by group; time to target on the leaderboard and compare, checked
against an independent reading of a metrics.jsonl."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from inflight.runs import group_selectors, services, sweeps
from inflight.runs.models import Run, RunGroup, RunStatus
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_client(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture(autouse=True)
def _room_for_sweeps(settings) -> None:
    settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER = 20


@pytest.fixture(autouse=True)
def _not_dispatched(django_capture_on_commit_callbacks):
    # The runs stay queued: what is tested is what the platform records, not a worker's run.
    with django_capture_on_commit_callbacks(execute=False):
        yield


def test_two_lrs_by_two_seeds_is_four_runs_in_one_group(owner, tiny_config) -> None:
    group = sweeps.create_sweep(owner, "lr", tiny_config, {"trainer.lr": [1e-4, 3e-4]}, 2)
    runs = list(Run.objects.filter(group=group).order_by("id"))
    assert len(runs) == 4 and all(run.status == RunStatus.QUEUED for run in runs)
    assert [(run.config["trainer"]["lr"], run.config["seed"]) for run in runs] == [(1e-4, 0), (1e-4, 1), (3e-4, 0), (3e-4, 1)]
    assert [run.group_point for run in runs][1] == {"trainer.lr": 1e-4, "seed": 1}
    assert runs[0].name == "lr lr=0.0001 seed=0"
    # Everything else is the base config, validated like any run (the run defaults filled in).
    assert all(run.config["trainer"]["max_steps"] == 2 and run.config["actor"]["group_size"] == 2 for run in runs)
    assert group.seeds == [0, 1] and group.grid == {"trainer.lr": [1e-4, 3e-4]}


def test_runs_past_the_active_run_limit_wait_in_the_sweep_and_are_queued_as_runs_end(owner, tiny_config, settings,
                                                                                       django_capture_on_commit_callbacks) -> None:
    settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER = 3
    already = services.create_run(owner, "already", tiny_config)
    group = sweeps.create_sweep(owner, "big", tiny_config, {"trainer.lr": [1e-4, 3e-4]}, 2)
    # Two slots were free: the first two points are queued, the other two wait (validated, in order).
    assert [(run.config["trainer"]["lr"], run.config["seed"]) for run in group.runs.order_by("id")] == [(1e-4, 0), (1e-4, 1)]
    group.refresh_from_db()
    assert [item["point"] for item in group.waiting] == [{"trainer.lr": 3e-4, "seed": 0}, {"trainer.lr": 3e-4, "seed": 1}]
    counts = group_selectors.group_counts([group.pk])[group.pk]
    assert counts["runs"] == 2 and counts["waiting"] == 2
    # A run that ends frees a slot: the next waiting run is queued once that end commits.
    with django_capture_on_commit_callbacks(execute=True):
        services.transition_run(already.pk, RunStatus.CANCELLED)
    group.refresh_from_db()
    assert len(group.waiting) == 1 and group.runs.count() == 3
    assert group.runs.order_by("-id").first().group_point == {"trainer.lr": 3e-4, "seed": 0}
    with django_capture_on_commit_callbacks(execute=True):
        services.transition_run(group.runs.order_by("id").first().pk, RunStatus.CANCELLED)
    group.refresh_from_db()
    assert group.waiting == [] and group.runs.count() == 4 and group.refused == []
    # No slot free, nothing waiting: an end queues nothing more.
    assert sweeps.queue_waiting(owner.pk) == []


def test_a_waiting_run_refused_when_its_turn_comes_is_kept_with_why(owner, tiny_config, settings, django_capture_on_commit_callbacks) -> None:
    settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER = 1
    group = sweeps.create_sweep(owner, "later", tiny_config, {}, 2)
    group.refresh_from_db()
    assert group.runs.count() == 1 and len(group.waiting) == 1
    settings.INFLIGHT_MAX_STEPS = 1  # the operator lowered a limit meanwhile: its turn refuses it
    with django_capture_on_commit_callbacks(execute=True):
        services.transition_run(group.runs.get().pk, RunStatus.CANCELLED)
    group.refresh_from_db()
    assert group.waiting == [] and group.runs.count() == 1
    assert group.refused[0]["point"] == {"seed": 1} and "INFLIGHT_MAX_STEPS" in group.refused[0]["error"]
    assert group_selectors.group_counts([group.pk])[group.pk]["refused"] == 1


def test_a_bad_point_refuses_the_sweep_naming_the_field(owner, tiny_config) -> None:
    with pytest.raises(sweeps.InvalidSweep) as refused:
        sweeps.create_sweep(owner, "bad", tiny_config, {"trainer.max_steps": [2, -1]}, 1)
    assert "trainer.max_steps" in refused.value.errors and "max_steps=-1" in refused.value.errors["trainer.max_steps"][0]
    with pytest.raises(sweeps.InvalidSweep) as refused:
        sweeps.create_sweep(owner, "bad", tiny_config, {"seed": [1, 2]}, 1)
    assert "grid.seed" in refused.value.errors
    with pytest.raises(sweeps.InvalidSweep) as refused:
        sweeps.create_sweep(owner, "bad", tiny_config, {}, 0)
    assert "seeds" in refused.value.errors
    assert not RunGroup.objects.exists() and not Run.objects.exists()


def test_run_list_shows_a_sweep_as_one_row_with_its_counts(owner, owner_client, tiny_config) -> None:
    group = sweeps.create_sweep(owner, "lr-sweep", tiny_config, {"trainer.lr": [1e-4, 3e-4]}, 2)
    runs = list(group.runs.order_by("id"))
    Run.objects.filter(pk=runs[0].pk).update(status=RunStatus.FAILED)
    Run.objects.filter(pk=runs[1].pk).update(status=RunStatus.RUNNING)
    Run.objects.filter(pk=runs[2].pk).update(status=RunStatus.SUCCEEDED)
    loose = services.create_run(owner, "alone", tiny_config)
    page = owner_client.get(reverse("web:run_list")).content.decode()
    assert page.count('class="group-row"') == 1
    row = page[page.index('class="group-row"'):]
    row = row[:row.index("</tr>")]
    assert "lr-sweep" in row and "4 runs" in row and "1 running" in row and "1 failed" in row and "1 succeeded" in row and "1 queued" in row
    for run in runs:  # folded under the sweep's row
        assert re.search(rf'<tr data-run-id="{run.pk}"[^>]*data-group-member="{group.pk}" class="group-member hidden"', page)
    assert re.search(rf'<tr data-run-id="{loose.pk}" data-terminal="0">', page)


# ---------------------------------------------------------------- time to target


def independent_time_to_target(metrics_jsonl: Path, samples_per_step: int, gain: float) -> dict[str, Any]:
    """Read straight from the file: the first held-out value, the first held-out line at or above
    it + gain; wall time from the file's first line."""
    records = [json.loads(line) for line in metrics_jsonl.read_text().splitlines() if line.strip()]
    t0 = records[0]["t"]
    heldout = [(r["step"], r["t"], r["success/heldout"]) for r in records if "success/heldout" in r]
    heldout.sort(key=lambda item: item[0])
    goal = heldout[0][2] + gain
    for step, t, value in heldout:
        if value >= goal:
            return {"wall_s": t - t0, "steps": step, "samples": step * samples_per_step}
    return {"reached": False}


def _write_and_ingest(run: Run, path: Path, heldout: list[tuple[int, float]], t0: float, seconds_per_step: float) -> None:
    lines = []
    for step in range(0, heldout[-1][0] + 1):
        record: dict[str, Any] = {"t": t0 + step * seconds_per_step + 0.25, "step": step, "train/loss": 1.0 / (step + 1)}
        lines.append(record)
        for at, value in heldout:
            if at == step:
                lines.append({"t": t0 + step * seconds_per_step + 0.5, "step": step, "success/heldout": value})
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    points = [point for number, record in enumerate(lines) for point in live_ingest.points_from_metrics_record(number, dict(record))]
    live_ingest.ingest_metrics(run.pk, points)


def test_time_to_target_columns_equal_an_independent_reading_of_metrics_jsonl(owner, owner_client, tiny_config, tmp_path: Path) -> None:
    config = {**tiny_config, "trainer": {**tiny_config["trainer"], "samples_per_step": 4}}
    fast = services.create_run(owner, "fast", config)
    slow = services.create_run(owner, "slow", config)
    never = services.create_run(owner, "never", config)
    _write_and_ingest(fast, tmp_path / "fast.jsonl", [(0, 0.30), (5, 0.42), (10, 0.55), (15, 0.70)], 1000.0, 1.5)
    _write_and_ingest(slow, tmp_path / "slow.jsonl", [(0, 0.10), (10, 0.20), (20, 0.28), (30, 0.31), (40, 0.50)], 5000.0, 2.25)
    _write_and_ingest(never, tmp_path / "never.jsonl", [(0, 0.50), (10, 0.55), (20, 0.60)], 9000.0, 1.0)

    page = owner_client.get(reverse("web:leaderboard")).content.decode()
    assert "To target: wall" in page and "+0.20 over the run&#x27;s first held-out value" in page
    for run, name in ((fast, "fast"), (slow, "slow")):
        expected = independent_time_to_target(tmp_path / f"{name}.jsonl", 4, 0.20)
        row = re.search(rf'<tr data-run-id="{run.pk}">(.*?)</tr>', page, re.S).group(1)
        cells = dict(re.findall(r'data-column="to_target_(\w+)" data-value="([^"]+)"', row))
        assert float(cells["wall"]) == pytest.approx(expected["wall_s"], abs=1e-5)
        assert int(cells["steps"]) == expected["steps"] and int(cells["samples"]) == expected["samples"]
    assert independent_time_to_target(tmp_path / "never.jsonl", 4, 0.20) == {"reached": False}
    never_row = re.search(rf'<tr data-run-id="{never.pk}">(.*?)</tr>', page, re.S).group(1)
    assert "not reached" in never_row

    # An absolute target, and a bad one named.
    page = owner_client.get(reverse("web:leaderboard") + "?target=0.55").content.decode()
    fast_row = re.search(rf'<tr data-run-id="{fast.pk}">(.*?)</tr>', page, re.S).group(1)
    assert re.search(r'data-column="to_target_steps" data-value="10"', fast_row)
    never_row = re.search(rf'<tr data-run-id="{never.pk}">(.*?)</tr>', page, re.S).group(1)
    assert re.search(r'data-column="to_target_steps" data-value="10"', never_row)
    bad = owner_client.get(reverse("web:leaderboard") + "?target=lots")
    assert bad.status_code == 400 and "target" in bad.content.decode()


def test_compare_by_group_says_runs_failed_and_time_to_target_per_group(owner, owner_client, tiny_config, tmp_path: Path) -> None:
    group = sweeps.create_sweep(owner, "seeds", tiny_config, {}, 3)
    runs = list(group.runs.order_by("id"))
    for index, run in enumerate(runs):
        _write_and_ingest(run, tmp_path / f"{run.pk}.jsonl", [(0, 0.1), (4 + 2 * index, 0.35)], 100.0, 1.0)
    Run.objects.filter(pk=runs[2].pk).update(status=RunStatus.FAILED)
    single = services.create_run(owner, "baseline", tiny_config)
    response = owner_client.get(reverse("web:compare") + f"?groups={group.pk}&runs={single.pk}&band=sd")
    assert response.status_code == 200
    page = response.content.decode()
    data = json.loads(html.unescape(re.search(r'<script id="page-data" type="application/json">(.*?)</script>', page, re.S).group(1)))
    assert [g["key"] for g in data["groups"]] == [f"g{group.pk}", f"r{single.pk}"]
    assert data["groups"][0]["run_ids"] == [run.pk for run in runs] and data["groups"][0]["failed"] == 1
    assert data["band"] == "sd" and data["loose_runs"] == [single.pk]
    assert "1 failed (partial curve included)" in page
    groups_table = page[page.index('id="time-to-target-groups"'):]
    sweep_row = re.search(rf'<tr data-group="g{group.pk}">(.*?)</tr>', groups_table, re.S).group(1)
    assert "3 of 3" in sweep_row and "6 ± 2" in sweep_row  # steps 4, 6, 8
    assert re.search(rf'<tr data-group="r{single.pk}">.*?not reached by any run', groups_table, re.S)
    assert owner_client.get(reverse("web:compare") + "?groups=999999").status_code == 404
    assert owner_client.get(reverse("web:compare") + f"?groups={group.pk}&band=wide").status_code == 400


def test_the_leaderboard_gives_each_sweep_on_the_page_a_row_with_its_time_to_target(owner, owner_client, tiny_config, tmp_path: Path) -> None:
    group = sweeps.create_sweep(owner, "lr-seeds", tiny_config, {"trainer.lr": [1e-4]}, 3)
    runs = list(group.runs.order_by("id"))
    for index, run in enumerate(runs[:2]):  # steps 4 and 8 to +0.20, 2 s a step
        _write_and_ingest(run, tmp_path / f"{run.pk}.jsonl", [(0, 0.1), (4 + 4 * index, 0.35)], 100.0, 2.0)
    _write_and_ingest(runs[2], tmp_path / f"{runs[2].pk}.jsonl", [(0, 0.1), (6, 0.2)], 100.0, 2.0)  # never reaches it
    Run.objects.filter(pk=runs[2].pk).update(status=RunStatus.FAILED)
    loose = services.create_run(owner, "loose", tiny_config)

    page = owner_client.get(reverse("web:leaderboard")).content.decode()
    table = page[page.index('id="leaderboard-sweeps"'):page.index('id="leaderboard"')]
    row = re.search(rf'<tr data-sweep-id="{group.pk}">(.*?)</tr>', table, re.S).group(1)
    assert "lr-seeds" in row and "(1 failed)" in row and "2 of 3" in row  # the failed run is counted, not dropped
    expected = [independent_time_to_target(tmp_path / f"{run.pk}.jsonl", tiny_config["trainer"]["samples_per_step"], 0.20) for run in runs[:2]]
    assert [e["steps"] for e in expected] == [4, 8]
    assert re.search(r'data-column="to_target_steps">6 ± 2\.83<', row), row  # mean and sd of 4 and 8
    assert f"?groups={group.pk}&amp;target=%2B0.20" in row
    assert table.count("data-sweep-id=") == 1  # the loose run has no sweep row
    assert f'<tr data-run-id="{loose.pk}">' in page

    # Another target reaches none of them: said so, not a blank.
    page = owner_client.get(reverse("web:leaderboard") + "?target=0.9").content.decode()
    assert "not reached by any run" in re.search(rf'<tr data-sweep-id="{group.pk}">(.*?)</tr>', page, re.S).group(1)


def test_create_page_sweep_panel_queues_a_group(owner, owner_client) -> None:
    form = owner_client.get(reverse("web:run_create")).content.decode()
    assert 'name="sweep"' in form and 'name="grid_key"' in form
    from tests.platform.test_pages import _form_post

    post = _form_post(**{"trainer.max_steps": "2"})
    post.update({"sweep": "1", "sweep_name": "from-form", "sweep_seeds": "2", "grid_key": ["trainer.lr", ""], "grid_values": ["1e-4, 3e-4", ""]})
    response = owner_client.post(reverse("web:run_create"), post)
    assert response.status_code == 302, response.content.decode()[:2000]
    group = RunGroup.objects.get(name="from-form")
    assert sorted((run.config["trainer"]["lr"], run.config["seed"]) for run in group.runs.all()) == [(1e-4, 0), (1e-4, 1), (3e-4, 0), (3e-4, 1)]
    post.update({"sweep_name": "bad", "grid_key": ["trainer.lr"], "grid_values": ["fast"]})
    refused = owner_client.post(reverse("web:run_create"), post)
    assert refused.status_code == 400 and not RunGroup.objects.filter(name="bad").exists()
    assert "trainer.lr" in refused.content.decode() and 'value="fast"' in refused.content.decode()
    post.update({"sweep_name": "bad", "grid_key": ["trainer.lr"], "grid_values": ["1e-4"], "sweep_seeds": "two"})
    refused = owner_client.post(reverse("web:run_create"), post).content.decode()
    panel = refused[refused.index('id="s-sweep"'):]
    assert "seeds: &#x27;two&#x27;: a count (3) or a list of seeds" in panel[:panel.index("</fieldset>")]
