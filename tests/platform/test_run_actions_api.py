"""Run actions through the JSON API on the real database (no engine): clone and fork with their
lineage, checkpoints, resume (and its refusals), tags / note / archive, delete, filters, and the
permission rules. The real-stack SIGKILL → resume is test_run_actions_stack.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from inflight.runs import services
from inflight.runs.models import EvalScore, MetricPoint, Run, RunStatus
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


def post(client, url, data=None):
    return client.post(url, json.dumps(data or {}), content_type="application/json")


def patch(client, url, data):
    return client.patch(url, json.dumps(data), content_type="application/json")


def make_run(owner, tiny_config, capture, status: str = RunStatus.FAILED, name: str = "src") -> Run:
    with capture(execute=False):
        run = services.create_run(owner, name, tiny_config)
    Run.objects.filter(pk=run.pk).update(status=status, finished_at=timezone.now())
    return Run.objects.get(pk=run.pk)


def write_checkpoint(run: Run, step: int) -> Path:
    folder = Path(settings.INFLIGHT_RUNS_DIR) / str(run.pk) / "checkpoints" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt"):
        (folder / name).write_bytes(b"x")
    (folder / "trainer_state.json").write_text(json.dumps({"version": step, "stream_position": {}, "consumed": 0, "t": 1234.5}))
    link = folder.parent / "latest"
    if link.is_symlink():
        link.unlink()
    os.symlink(folder.name, link)
    return folder


def test_clone_merges_overrides_and_records_its_parent(owner, owner_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        response = post(owner_api, f"/api/runs/{source.pk}/clone/", {"name": "lr-up", "config": {"trainer": {"lr": 3e-4}}})
    assert response.status_code == 201, response.content
    clone = response.json()
    assert clone["parent"] == source.pk and clone["parent_step"] is None and clone["status"] == "queued"
    assert clone["name"] == "lr-up" and clone["config"]["trainer"]["lr"] == 3e-4
    # Everything not overridden is the source's.
    assert clone["config"]["trainer"]["max_steps"] == source.config["trainer"]["max_steps"]
    assert clone["config"]["actor"] == source.config["actor"]
    bad = post(owner_api, f"/api/runs/{source.pk}/clone/", {"config": {"trainer": {"lr": "fast"}}})
    assert bad.status_code == 400 and "trainer.lr" in bad.json()["fields"]
    assert post(owner_api, f"/api/runs/{source.pk}/clone/", {"colour": 1}).status_code == 400


def test_fork_from_a_checkpoint_uses_it_as_the_model(owner, owner_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    folder = write_checkpoint(source, 4)
    EvalScore.objects.create(run=source, benchmark="math500", step=4, k=1, mean_at_k=0.25, pass_at_k=0.25, num_problems=4, num_samples=4, t=1.0)
    listed = owner_api.get(f"/api/runs/{source.pk}/checkpoints/").json()["checkpoints"]
    assert listed == [{"step": 4, "t": 1234.5, "path": str(folder.resolve()), "evals": {"math500": 0.25}, "latest": True}]
    missing = post(owner_api, f"/api/runs/{source.pk}/clone/", {"from_step": 7})
    assert missing.status_code == 400 and "no checkpoint at step 7 (it has: 4)" in missing.json()["error"]
    with django_capture_on_commit_callbacks(execute=False):
        response = post(owner_api, f"/api/runs/{source.pk}/clone/", {"from_step": 4, "config": {"trainer": {"max_steps": 3}}})
    assert response.status_code == 201, response.content
    fork = response.json()
    assert fork["parent"] == source.pk and fork["parent_step"] == 4
    assert fork["config"]["model"]["path"] == str(folder.resolve()) and fork["config"]["model"]["build_tiny_if_missing"] is False


def test_others_cannot_see_clone_fork_or_resume_a_run(owner, other_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    write_checkpoint(source, 2)
    for method, url, body in (
        ("post", f"/api/runs/{source.pk}/clone/", {}),
        ("post", f"/api/runs/{source.pk}/clone/", {"from_step": 2}),
        ("post", f"/api/runs/{source.pk}/resume/", {}),
        ("get", f"/api/runs/{source.pk}/checkpoints/", None),
        ("patch", f"/api/runs/{source.pk}/", {"note": "mine now"}),
        ("delete", f"/api/runs/{source.pk}/", None),
    ):
        if method == "post":
            response = post(other_api, url, body)
        elif method == "patch":
            response = patch(other_api, url, body)
        else:
            response = getattr(other_api, method)(url)
        assert response.status_code == 404, (method, url, response.content)
    assert Run.objects.filter(pk=source.pk, note="").exists()


def test_resume_requeues_the_same_run_and_refuses_loudly(owner, owner_api, staff_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    refused = post(owner_api, f"/api/runs/{source.pk}/resume/")
    assert refused.status_code == 409 and "checkpoints/latest does not exist" in refused.json()["error"]
    folder = write_checkpoint(source, 3)
    shutil.rmtree(folder)  # the checkpoint was deleted: named, not silently started over
    refused = post(owner_api, f"/api/runs/{source.pk}/resume/")
    assert refused.status_code == 409 and "checkpoints/step_000003" in refused.json()["error"]
    write_checkpoint(source, 3)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = post(owner_api, f"/api/runs/{source.pk}/resume/")
    assert response.status_code == 200, response.content
    resumed = response.json()
    assert resumed["id"] == source.pk and resumed["status"] == "queued" and resumed["resume_count"] == 1 and resumed["error"] == ""
    assert len(callbacks) >= 1  # dispatched after commit
    again = post(owner_api, f"/api/runs/{source.pk}/resume/")
    assert again.status_code == 409 and "is queued" in again.json()["error"]
    Run.objects.filter(pk=source.pk).update(status=RunStatus.SUCCEEDED)
    assert post(staff_api, f"/api/runs/{source.pk}/resume/").status_code == 409


def test_patch_tags_note_archive_and_filters(owner, owner_api, staff_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    first = make_run(owner, tiny_config, django_capture_on_commit_callbacks, name="alpha")
    second = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="beta")
    response = patch(owner_api, f"/api/runs/{first.pk}/", {"tags": ["lr-sweep", "lr-sweep", " baseline "], "note": "diverged at 40"})
    assert response.status_code == 200, response.content
    assert response.json()["tags"] == ["lr-sweep", "baseline"] and response.json()["note"] == "diverged at 40"
    assert patch(owner_api, f"/api/runs/{first.pk}/", {"tags": ["no spaces allowed"]}).status_code == 400
    assert patch(owner_api, f"/api/runs/{first.pk}/", {"archived": "yes"}).status_code == 400
    assert patch(owner_api, f"/api/runs/{first.pk}/", {"status": "succeeded"}).status_code == 400
    # Staff may see the run but not edit someone else's labels.
    assert patch(staff_api, f"/api/runs/{first.pk}/", {"note": "x"}).status_code == 403

    def ids(query: str) -> list[int]:
        response = owner_api.get(f"/api/runs/{query}")
        assert response.status_code == 200, response.content
        return [run["id"] for run in response.json()["runs"]]

    assert ids("?tag=lr-sweep") == [first.pk]
    assert ids("?status=succeeded") == [second.pk]
    assert ids("?q=ALP") == [first.pk]
    assert ids("?sort=name") == [first.pk, second.pk] and ids("?sort=-name") == [second.pk, first.pk]
    assert patch(owner_api, f"/api/runs/{first.pk}/", {"archived": True}).json()["archived"] is True
    assert ids("") == [second.pk] and ids("?archived=1") == [first.pk] and set(ids("?archived=all")) == {first.pk, second.pk}
    assert patch(owner_api, f"/api/runs/{first.pk}/", {"archived": False}).json()["archived"] is False
    assert set(ids("")) == {first.pk, second.pk}
    assert owner_api.get("/api/runs/?sort=colour").status_code == 400
    assert owner_api.get("/api/runs/?archived=maybe").status_code == 400


def test_delete_by_owner_removes_rows_and_asks_a_worker_for_the_directory(owner, owner_api, staff_api, tiny_config, django_capture_on_commit_callbacks, monkeypatch) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    write_checkpoint(source, 1)
    live_ingest.ingest_metrics(source.pk, [PointIn(line=0, name="train/loss", step=1, t=1.0, value=0.5)])
    with django_capture_on_commit_callbacks(execute=False):
        fork = post(owner_api, f"/api/runs/{source.pk}/clone/", {"from_step": 1}).json()
    refused = owner_api.delete(f"/api/runs/{source.pk}/")
    assert refused.status_code == 409 and f"#{fork['id']}" in refused.json()["error"]
    Run.objects.filter(pk=fork["id"]).update(status=RunStatus.CANCELLED)
    assert staff_api.delete(f"/api/runs/{source.pk}/").status_code == 403
    sent = []
    monkeypatch.setattr("inflight.runs.actions.dispatch_run_dir_removal", lambda run_id, queue: sent.append((run_id, queue)))
    with django_capture_on_commit_callbacks(execute=True):
        response = owner_api.delete(f"/api/runs/{source.pk}/")
    assert response.status_code == 200 and response.json() == {"deleted": source.pk}
    assert not Run.objects.filter(pk=source.pk).exists() and not MetricPoint.objects.filter(run_id=source.pk).exists()
    assert sent == [(source.pk, "cpu")]
    assert Run.objects.get(pk=fork["id"]).parent_id is None  # the child keeps its own history
    # The worker's task removes the directory once the rows are gone.
    from workers.tasks import delete_run_dir

    assert delete_run_dir(source.pk) == "removed" and not (Path(settings.INFLIGHT_RUNS_DIR) / str(source.pk)).exists()


def test_superseding_a_rewound_history_keeps_each_step_once(owner, tiny_config, django_capture_on_commit_callbacks) -> None:
    from inflight.live.selectors import run_snapshot
    from inflight.runs.actions import supersede_rewound_history

    run = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    live_ingest.ingest_metrics(run.pk, [PointIn(line=n, name="train/loss", step=n + 1, t=1.0, value=float(n)) for n in range(6)])
    EvalScore.objects.create(run=run, benchmark="math500", step=5, k=1, mean_at_k=0.5, pass_at_k=0.5, num_problems=1, num_samples=1, t=1.0)
    seq_before = Run.objects.get(pk=run.pk).metrics_seq
    assert supersede_rewound_history(run.pk, step=3, metrics_lines=6, resumed_t=2.0) == 3
    assert supersede_rewound_history(run.pk, step=3, metrics_lines=6, resumed_t=2.0) == 0  # idempotent
    assert not EvalScore.objects.filter(run=run).exists()
    # The resumed attempt logs steps 4.. again, after the old lines.
    live_ingest.ingest_metrics(run.pk, [PointIn(line=6 + n, name="train/loss", step=4 + n, t=3.0, value=10.0 + n) for n in range(3)])
    steps = sorted(MetricPoint.objects.filter(run=run, name="train/loss").values_list("step", flat=True))
    assert steps == [1, 2, 3, 4, 5, 6]
    snapshot = run_snapshot(Run.objects.get(pk=run.pk), names=["train/loss"])
    assert snapshot["seq"] == seq_before + 2  # a gap: open pages reload the snapshot
    series = snapshot["series"]["train/loss"]
    assert series["step"] == [1, 2, 3, 4, 5, 6] and series["max"] == [0, 1, 2, 10, 11, 12]  # the old 3, 4, 5 are gone
