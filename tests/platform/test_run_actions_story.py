"""Issue 15 end to end as a demanding user would try it (real database, no engine): the
leaderboard API with the run list's filters, the clone page's live YAML diff endpoint, cloning
a running run, forking another user's checkpoint by any route, resuming a succeeded run, deleting
a parent whose children live on, and archive-then-filter across list, compare, leaderboard, API."""

from __future__ import annotations

import html as html_lib
import json
import re

import pytest
from django.test import Client
from django.utils import timezone

from inflight.runs.models import EvalScore, Run, RunStatus
from tests.platform.test_run_actions_api import make_run, post, write_checkpoint

pytestmark = pytest.mark.django_db


def score(run: Run, value: float) -> None:
    EvalScore.objects.create(run=run, benchmark="math500", step=1, k=1, mean_at_k=value, pass_at_k=value, num_problems=1, num_samples=1, t=1.0)


def board_ids(client: Client, query: str) -> list[int]:
    response = client.get(f"/api/leaderboard/{query}")
    assert response.status_code == 200, response.content
    return [row["run_id"] for row in response.json()["rows"]]


# ---------------------------------------------------------------- leaderboard API filters


def test_leaderboard_api_takes_the_run_list_filters(owner, other_user, owner_api, staff_api, tiny_config, django_capture_on_commit_callbacks) -> None:
    good = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="lr-high")
    bad = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.FAILED, name="lr-low")
    shelved = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="old")
    theirs = make_run(other_user, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="lr-theirs")
    for run, value in ((good, 0.6), (bad, 0.2), (shelved, 0.9), (theirs, 0.4)):
        score(run, value)
    Run.objects.filter(pk=good.pk).update(tags=["sweep"])
    Run.objects.filter(pk=shelved.pk).update(archived_at=timezone.now())

    # Archived runs are hidden by default, as on the run list; the leaderboard's own sort still applies.
    assert board_ids(owner_api, "?sort=-math500_best") == [good.pk, bad.pk]
    assert board_ids(owner_api, "?sort=math500_best") == [bad.pk, good.pk]
    assert board_ids(owner_api, "?status=succeeded") == [good.pk]
    assert board_ids(owner_api, "?tag=sweep") == [good.pk]
    assert board_ids(owner_api, "?q=LOW") == [bad.pk]
    assert board_ids(owner_api, "?archived=1") == [shelved.pk]
    assert board_ids(owner_api, "?archived=all&sort=-math500_best") == [shelved.pk, good.pk, bad.pk]
    # The owner filter narrows staff's view; for others it can only match their own runs.
    assert board_ids(staff_api, "?owner=other") == [theirs.pk]
    assert board_ids(staff_api, "?q=lr-&sort=-math500_best") == [good.pk, theirs.pk, bad.pk]
    assert board_ids(owner_api, "?owner=other") == []
    # The same refusals as the run list, in the one error shape.
    for query, named in (("?status=exploded", "status"), ("?archived=maybe", "archived"), ("?tag=" + "x" * 41, "tag"), ("?sort=colour", "sort")):
        response = owner_api.get(f"/api/leaderboard/{query}")
        assert response.status_code == 400 and response.json()["error"].startswith(named), (query, response.content)
    # A run-list sort column is not a leaderboard column: the leaderboard's sort wins, and says so.
    assert "unknown sort key 'created'" in owner_api.get("/api/leaderboard/?sort=-created").json()["error"]


# ---------------------------------------------------------------- the YAML tab's live diff


def csrf_client(user) -> tuple[Client, str]:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/runs/new/")  # sets the CSRF cookie
    return client, client.cookies["csrftoken"].value


def page_yaml(html: str) -> str:
    return html_lib.unescape(re.search(r'<textarea name="config_yaml"[^>]*>(.*?)</textarea>', html, re.S).group(1))


def test_yaml_tab_diff_endpoint(owner, other_user, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    folder = write_checkpoint(source, 2)
    client, token = csrf_client(owner)
    page = client.get(f"/runs/{source.pk}/clone/").content.decode()
    url = f"/runs/{source.pk}/clone/diff.json"
    assert f'data-diff-url="{url}"' in page and 'id="clone-diff-error"' in page
    text = page_yaml(page)

    # CSRF-protected like the page's forms: without the token, refused, in JSON the script can show.
    refused = client.post(url, {"config_yaml": text})
    assert refused.status_code == 403 and refused["Content-Type"] == "application/json"
    assert "CSRF" in refused.json()["error"] and "X-CSRFToken" in refused.json()["error"]
    page_refused = client.post(f"/runs/{source.pk}/clone/", {"config_yaml": text})  # a page: the site's error page
    assert page_refused.status_code == 403 and "CSRF check failed" in page_refused.content.decode()
    unchanged = client.post(url, {"config_yaml": text, "csrfmiddlewaretoken": token})
    assert unchanged.status_code == 200 and unchanged.json() == {"run": source.pk, "diff": [], "errors": {}}
    edited = text.replace("max_steps: 2", "max_steps: 7")
    assert edited != text
    response = client.post(url, {"config_yaml": edited}, HTTP_X_CSRFTOKEN=token)
    assert response.json()["diff"] == [{"path": "trainer.max_steps", "source": 2, "new": 7}]
    # A partial text means "defaults for the rest", as on submission: the diff says which moved.
    partial = client.post(url, {"config_yaml": "trainer:\n  lr: 0.5\n"}, HTTP_X_CSRFTOKEN=token).json()["diff"]
    paths = [row["path"] for row in partial]
    assert "trainer.lr" in paths and "trainer.max_steps" in paths and paths == sorted(paths)
    # What a submission would be refused for comes with the diff (the same checks as submitting).
    invalid = client.post(url, {"config_yaml": edited.replace("max_steps: 7", "max_steps: -3")}, HTTP_X_CSRFTOKEN=token).json()
    assert invalid["diff"] and list(invalid["errors"]) == ["trainer.max_steps"]
    outside = client.post(url, {"config_yaml": "model:\n  path: /etc\n"}, HTTP_X_CSRFTOKEN=token).json()
    assert "model.path" in outside["errors"]

    # Bad YAML: a clear 400 in the one error shape, nothing stored.
    for bad, says in (("trainer: [1, 2", "config_yaml:"), ("- a\n- b\n", "top level must be a mapping"), ("a: &x 1\nb: *x\n", "config_yaml:")):
        refused = client.post(url, {"config_yaml": bad}, HTTP_X_CSRFTOKEN=token)
        assert refused.status_code == 400 and says in refused.json()["error"], (bad, refused.content)
    assert Run.objects.count() == 1

    # A fork's page diffs against its source too: the model is the checkpoint.
    fork_page = client.get(f"/runs/{source.pk}/clone/?from_step=2").content.decode()
    assert f'data-diff-url="{url}?from_step=2"' in fork_page
    fork_diff = client.post(f"{url}?from_step=2", {"config_yaml": page_yaml(fork_page)}, HTTP_X_CSRFTOKEN=token).json()["diff"]
    assert [row["new"] for row in fork_diff if row["path"] == "model.path"] == [str(folder.resolve())]
    assert client.post(f"{url}?from_step=x", {"config_yaml": text}, HTTP_X_CSRFTOKEN=token).status_code == 400

    # Someone else's run: 404 (not revealed); signed out: 401; both as JSON.
    stranger, stranger_token = csrf_client(other_user)
    hidden = stranger.post(url, {"config_yaml": text}, HTTP_X_CSRFTOKEN=stranger_token)
    assert hidden.status_code == 404 and "error" in hidden.json()
    anonymous = Client()
    assert anonymous.post(url, {"config_yaml": text}).status_code == 401


# ---------------------------------------------------------------- the user story


def test_clone_and_fork_a_running_run(owner, owner_api, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    running = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.RUNNING, name="live")
    Run.objects.filter(pk=running.pk).update(finished_at=None)
    folder = write_checkpoint(running, 3)
    with django_capture_on_commit_callbacks(execute=False):
        clone = post(owner_api, f"/api/runs/{running.pk}/clone/", {"config": {"trainer": {"max_steps": 3}}})
        fork = post(owner_api, f"/api/runs/{running.pk}/clone/", {"from_step": 3})
    assert clone.status_code == 201 and clone.json()["parent"] == running.pk, clone.content
    assert fork.status_code == 201 and fork.json()["parent_step"] == 3 and fork.json()["config"]["model"]["path"] == str(folder.resolve())
    # The page route too, and the source keeps running untouched.
    assert owner_web.get(f"/runs/{running.pk}/clone/").status_code == 200
    assert Run.objects.get(pk=running.pk).status == RunStatus.RUNNING
    # A running run cannot be deleted (nor, later, while its fork still reads its checkpoint).
    refused = owner_api.delete(f"/api/runs/{running.pk}/")
    assert refused.status_code == 409 and "is running; stop it" in refused.json()["error"]


def test_another_users_checkpoint_cannot_be_forked_by_any_route(owner, other_user, owner_api, other_api, other_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    theirs = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    folder = write_checkpoint(theirs, 2)
    mine = make_run(other_user, tiny_config, django_capture_on_commit_callbacks, name="mine")
    before = Run.objects.count()
    # The fork routes of their run: 404, its existence not revealed.
    assert post(other_api, f"/api/runs/{theirs.pk}/clone/", {"from_step": 2}).status_code == 404
    assert other_web.get(f"/runs/{theirs.pk}/clone/?from_step=2").status_code == 404
    assert other_web.post(f"/runs/{theirs.pk}/clone/?from_step=2", {"mode": "yaml", "config_yaml": "{}"}).status_code == 404
    # Naming the checkpoint's path directly: refused on model.path, by a new run or a clone of one's own.
    for path in (str(folder), str(folder.parent / "latest")):
        created = post(other_api, "/api/runs/", {"name": "sneak", "config": {**tiny_config, "model": {"path": path}}})
        assert created.status_code == 400 and "not a checkpoint of one of your runs" in created.json()["fields"]["model.path"][0]
        cloned = post(other_api, f"/api/runs/{mine.pk}/clone/", {"config": {"model": {"path": path}}})
        assert cloned.status_code == 400 and "model.path" in cloned.json()["fields"]
    # Nor does their checkpoint show in the create form's picker.
    assert f"{theirs.pk}/checkpoints" not in other_web.get("/runs/new/").content.decode()
    assert Run.objects.count() == before


def test_resuming_a_succeeded_run_is_refused_clearly(owner, owner_api, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    done = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED)
    write_checkpoint(done, 2)  # a checkpoint is there: the state alone refuses
    expected = f"only a failed, lost or cancelled run can be resumed; run {done.pk} is succeeded"
    refused = post(owner_api, f"/api/runs/{done.pk}/resume/")
    assert refused.status_code == 409 and refused.json()["error"] == f"cannot resume: {expected}"
    assert 'id="resume-button"' not in owner_web.get(f"/runs/{done.pk}/").content.decode()
    page = owner_web.post(f"/runs/{done.pk}/resume/", follow=True)
    assert page.status_code == 200 and f"Cannot resume: {expected}" in page.content.decode()
    done.refresh_from_db()
    assert done.status == RunStatus.SUCCEEDED and done.resume_count == 0


def test_deleting_a_parent_keeps_its_children_readable(owner, owner_api, owner_web, tiny_config, django_capture_on_commit_callbacks, monkeypatch) -> None:
    monkeypatch.setattr("inflight.runs.actions.dispatch_run_dir_removal", lambda run_id, queue: None)
    parent = make_run(owner, tiny_config, django_capture_on_commit_callbacks, name="parent")
    folder = write_checkpoint(parent, 2)
    with django_capture_on_commit_callbacks(execute=False):
        fork_id = post(owner_api, f"/api/runs/{parent.pk}/clone/", {"from_step": 2}).json()["id"]
        clone_id = post(owner_api, f"/api/runs/{parent.pk}/clone/", {}).json()["id"]
        # Started from the checkpoint on the create form's picker: no parent recorded, same files.
        picked = post(owner_api, "/api/runs/", {"name": "picked", "config": {**tiny_config, "model": {"path": str(folder)}}})
    assert picked.status_code == 201, picked.content
    Run.objects.filter(pk__in=[fork_id, clone_id]).update(status=RunStatus.CANCELLED, finished_at=timezone.now())
    refused = owner_api.delete(f"/api/runs/{parent.pk}/")
    assert refused.status_code == 409 and f"#{picked.json()['id']}" in refused.json()["error"]
    Run.objects.filter(pk=picked.json()["id"]).update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        assert owner_web.post(f"/runs/{parent.pk}/delete/", {"confirm": str(parent.pk)}).status_code == 302

    fork_page = owner_web.get(f"/runs/{fork_id}/")
    assert fork_page.status_code == 200
    assert f"Forked at step 2 from #{parent.pk} {parent.name}, since deleted" in fork_page.content.decode()
    clone_page = owner_web.get(f"/runs/{clone_id}/")
    assert clone_page.status_code == 200 and f"Cloned from #{parent.pk} {parent.name}, since deleted" in clone_page.content.decode()
    assert owner_web.get("/?archived=all").status_code == 200
    assert owner_api.get(f"/api/runs/{fork_id}/").json()["parent"] is None
    # Compare still draws the fork from its fork step, with its parent gone.
    compare = owner_web.get(f"/compare/?runs={fork_id},{clone_id}").content.decode()
    data = json.loads(compare.split('id="page-data" type="application/json">', 1)[1].split("</script>", 1)[0])
    assert [r["step_offset"] for r in data["runs"]] == [2, 0]
    # Its "New run from this" still opens; launching it names the vanished checkpoint.
    assert owner_web.get(f"/runs/{fork_id}/clone/").status_code == 200
    relaunch = post(owner_api, f"/api/runs/{fork_id}/clone/", {})
    assert relaunch.status_code == 400 and "model.path" in relaunch.json()["fields"]


def test_archive_then_filter_everywhere(owner, owner_api, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    kept = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="kept-run")
    shelved = make_run(owner, tiny_config, django_capture_on_commit_callbacks, status=RunStatus.SUCCEEDED, name="shelved-run")
    score(kept, 0.3)
    score(shelved, 0.7)
    assert owner_web.post(f"/runs/{shelved.pk}/edit/", {"archived": "1"}).status_code == 302

    def listed(html: str, run: Run) -> bool:
        # A row's link (list, leaderboard) or a checkbox of compare's run picker.
        return f'href="/runs/{run.pk}/"' in html or f'name="runs" value="{run.pk}"' in html

    for url in ("/", "/leaderboard/", "/compare/"):
        html = owner_web.get(url).content.decode()
        assert listed(html, kept) and not listed(html, shelved), url
        html = owner_web.get(url + "?archived=1").content.decode()
        assert listed(html, shelved) and not listed(html, kept), url
    assert board_ids(owner_api, "") == [kept.pk] and board_ids(owner_api, "?archived=all") == [shelved.pk, kept.pk]
    assert [r["id"] for r in owner_api.get("/api/runs/").json()["runs"]] == [kept.pk]
    # Archived is hidden, not gone: its page and a compare address naming it still open.
    assert owner_web.get(f"/runs/{shelved.pk}/").status_code == 200
    assert owner_web.get(f"/compare/?runs={kept.pk},{shelved.pk}").status_code == 200
    owner_web.post(f"/runs/{shelved.pk}/edit/", {"archived": "0"})
    assert set(board_ids(owner_api, "")) == {kept.pk, shelved.pk}
