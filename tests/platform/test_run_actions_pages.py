"""Run actions on the pages (Django test client, real database, no engine): clone with its diff,
fork from the run page's checkpoint list, lineage on both run pages, resume, tags / note /
archive, delete with confirmation, run-list filters and sorting, compare state and offsets."""

from __future__ import annotations

import json
import re

import pytest

from inflight.runs.models import Run, RunStatus
from tests.platform.test_run_actions_api import make_run, write_checkpoint

pytestmark = pytest.mark.django_db


def form_post_data(html: str) -> dict[str, str]:
    """The form tab's inputs as the browser would post them (checked boxes only)."""
    form = html.split('data-panel="form"', 1)[1].split("</form>", 1)[0]
    data: dict[str, str] = {}
    for tag in re.findall(r"<(?:input|select|textarea)[^>]*>", form):
        name = re.search(r'name="([^"]+)"', tag)
        if not name or "csrfmiddlewaretoken" in tag:
            continue
        if 'type="checkbox"' in tag:
            if " checked" in tag:
                data[name.group(1)] = "on"
            continue
        value = re.search(r'value="([^"]*)"', tag)
        data[name.group(1)] = value.group(1) if value else ""
    for name, text in re.findall(r'<textarea[^>]*name="([^"]+)"[^>]*>(.*?)</textarea>', form, re.S):
        data[name] = text
    for name, body in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', form, re.S):
        chosen = re.search(r'<option value="([^"]*)"[^>]*selected', body)
        data[name] = chosen.group(1) if chosen else ""
    import html as html_lib

    return {key: html_lib.unescape(value) for key, value in data.items()}


def test_clone_page_prefills_shows_the_diff_and_records_the_parent(owner, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    page = owner_web.get(f"/runs/{source.pk}/clone/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"New run from <a href=\"/runs/{source.pk}/\">#{source.pk}" in html and 'id="clone-source"' in html
    data = form_post_data(html)
    assert data["trainer.max_steps"] == str(source.config["trainer"]["max_steps"]) and data["name"] == "src-clone"
    data["trainer.max_steps"] = "3"
    data["trainer.lr"] = "0.0005"
    data["inference.max_batch_size"] = "not a number"  # an error: the page comes back with the diff
    with django_capture_on_commit_callbacks(execute=False):
        refused = owner_web.post(f"/runs/{source.pk}/clone/", data)
    assert refused.status_code == 400
    diff = refused.content.decode().split('id="clone-diff-table"', 1)[1].split("</table>", 1)[0]
    assert 'data-path="trainer.max_steps"' in diff and 'data-path="trainer.lr"' in diff and 'data-path="actor.group_size"' not in diff
    data["inference.max_batch_size"] = "8"
    with django_capture_on_commit_callbacks(execute=False):
        response = owner_web.post(f"/runs/{source.pk}/clone/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    clone = Run.objects.exclude(pk=source.pk).get()
    assert clone.parent_id == source.pk and clone.parent_step is None
    assert clone.config["trainer"]["max_steps"] == 3 and clone.config["trainer"]["lr"] == 0.0005
    child_page = owner_web.get(f"/runs/{clone.pk}/").content.decode()
    assert f"Cloned from <a href=\"/runs/{source.pk}/\">#{source.pk}" in child_page
    assert f'href="/runs/{clone.pk}/">#{clone.pk} src-clone</a>' in owner_web.get(f"/runs/{source.pk}/").content.decode()


def test_fork_from_the_checkpoint_list(owner, owner_web, other_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    folder = write_checkpoint(source, 2)
    run_page = owner_web.get(f"/runs/{source.pk}/").content.decode()
    assert 'id="checkpoints-table"' in run_page and f'href="/runs/{source.pk}/clone/?from_step=2"' in run_page
    page = owner_web.get(f"/runs/{source.pk}/clone/?from_step=2").content.decode()
    assert "Fork: the model is checkpoint step 2" in page
    # It says what a fork restarts, and its checkpoint picker does not offer "(none)" (issue 33).
    assert "its optimizer (AdamW moments) starts fresh, its learning rate warms up again" in page
    assert "(none: use model.path below)" not in page and f"(the fork's checkpoint: step 2 of #{source.pk}," in page
    data = form_post_data(page)
    assert data["model.path"] == str(folder.resolve())
    with django_capture_on_commit_callbacks(execute=False):
        assert owner_web.post(f"/runs/{source.pk}/clone/?from_step=2", data).status_code == 302
    fork = Run.objects.exclude(pk=source.pk).get()
    assert fork.parent_id == source.pk and fork.parent_step == 2 and fork.config["model"]["path"] == str(folder.resolve())
    assert "Forked from" in owner_web.get(f"/runs/{fork.pk}/").content.decode()
    assert owner_web.get(f"/runs/{source.pk}/clone/?from_step=9").status_code == 400
    assert other_web.get(f"/runs/{source.pk}/clone/?from_step=2").status_code == 404
    # Compare draws the fork from step 2 on the step axis.
    compare = owner_web.get(f"/compare/?runs={source.pk},{fork.pk}&metrics=train/loss&x=samples&smooth=0.3").content.decode()
    page_data = json.loads(compare.split('id="page-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    assert [r["step_offset"] for r in page_data["runs"]] == [0, 2]
    assert page_data["metrics"] == ["train/loss"] and page_data["x"] == "samples" and page_data["smooth"] == 0.3
    assert owner_web.get(f"/compare/?runs={source.pk}&x=sideways").status_code == 400


def test_resume_archive_tags_and_delete_on_the_pages(owner, owner_web, other_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    run = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.LOST, name="gamma")
    page = owner_web.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="resume-button" disabled' in page and "checkpoints/latest does not exist" in page
    write_checkpoint(run, 1)
    assert 'id="resume-button" disabled' not in owner_web.get(f"/runs/{run.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=False):
        owner_web.post(f"/runs/{run.pk}/resume/")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.resume_count == 1
    assert other_web.post(f"/runs/{run.pk}/resume/").status_code == 404
    owner_web.post(f"/runs/{run.pk}/edit/", {"tags": "sweep, best", "note": "keep this one"})
    run.refresh_from_db()
    assert run.tags == ["sweep", "best"] and run.note == "keep this one"
    listed = owner_web.get("/?tag=sweep").content.decode()
    assert f'data-run-id="{run.pk}"' in listed
    assert f'data-run-id="{run.pk}"' not in owner_web.get("/?tag=other").content.decode()
    assert owner_web.get("/?sort=bogus").status_code == 400
    owner_web.post(f"/runs/{run.pk}/edit/", {"archived": "1"})
    assert f'data-run-id="{run.pk}"' not in owner_web.get("/").content.decode()
    assert f'data-run-id="{run.pk}"' in owner_web.get("/?archived=1").content.decode()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)
    assert owner_web.get(f"/runs/{run.pk}/delete/").status_code == 200
    owner_web.post(f"/runs/{run.pk}/delete/", {"confirm": "wrong"})
    assert Run.objects.filter(pk=run.pk).exists()
    assert other_web.post(f"/runs/{run.pk}/delete/", {"confirm": str(run.pk)}).status_code == 404
    with django_capture_on_commit_callbacks(execute=False):
        assert owner_web.post(f"/runs/{run.pk}/delete/", {"confirm": str(run.pk)}).status_code == 302
    assert not Run.objects.filter(pk=run.pk).exists()


def test_run_list_sorts_by_a_column_and_leaderboard_filters(owner, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    a = make_run(owner, tiny_config, django_capture_on_commit_callbacks, name="bbb")
    b = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="aaa")
    html = owner_web.get("/?sort=name").content.decode()
    assert html.index(f'data-run-id="{b.pk}"') < html.index(f'data-run-id="{a.pk}"')
    html = owner_web.get("/?sort=-name").content.decode()
    assert html.index(f'data-run-id="{a.pk}"') < html.index(f'data-run-id="{b.pk}"')
    board = owner_web.get("/leaderboard/?status=succeeded&sort=-success_best").content.decode()
    assert f'/runs/{b.pk}/' in board and f'/runs/{a.pk}/' not in board
