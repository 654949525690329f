"""Who may see and stop what, on every page and endpoint: the owner, another user, staff, anonymous.

(The WebSocket side of the same rules is in test_live_consumer.py.)
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from inflight.runs import services
from inflight.runs.models import Run, RunStatus
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def run(owner) -> Run:
    run = services.create_run(owner, "owners-run", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(line=0, name="reward/mean", step=0, t=1.0, value=0.5)])
    return run


def _run_urls(run_id: int) -> dict[str, str]:
    return {
        "detail": reverse("web:run_detail", args=[run_id]),
        "snapshot": reverse("web:run_snapshot", args=[run_id]),
        "status": reverse("web:run_status", args=[run_id]),
        "compare": reverse("web:compare") + f"?runs={run_id}",
    }


GLOBAL_PAGES = ["web:run_list", "web:run_create", "web:compare", "web:leaderboard", "web:workers", "web:runs_status"]


def test_anonymous_is_sent_to_login_or_gets_401(run) -> None:
    client = _client(None)
    for name in GLOBAL_PAGES:
        response = client.get(reverse(name))
        if name == "web:runs_status":
            assert response.status_code == 401 and "sign in" in response.json()["error"]
        else:
            assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), name
    for kind, url in _run_urls(run.pk).items():
        response = client.get(url)
        if kind in ("snapshot", "status"):
            assert response.status_code == 401, kind
        else:
            assert response.status_code == 302 and "/accounts/login/" in response["Location"], kind
    assert client.post(reverse("web:run_stop", args=[run.pk])).status_code == 302
    assert client.post(reverse("web:run_create"), {"mode": "yaml", "config_yaml": "{}"}).status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and Run.objects.count() == 1


def test_another_user_neither_sees_nor_stops_the_run(run, other_user) -> None:
    client = _client(other_user)
    for kind, url in _run_urls(run.pk).items():
        response = client.get(url)
        assert response.status_code == 404, kind
        assert "owners-run" not in response.content.decode() and "0.5" not in response.content.decode()
    assert client.post(reverse("web:run_stop", args=[run.pk])).status_code == 404
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    for name in ("web:run_list", "web:leaderboard", "web:compare"):
        page = client.get(reverse(name))
        assert page.status_code == 200 and "owners-run" not in page.content.decode(), name
    assert client.get(reverse("web:runs_status") + f"?ids={run.pk}").json() == {"runs": []}


def test_owner_sees_everything_of_their_run(run, owner) -> None:
    client = _client(owner)
    for name in GLOBAL_PAGES:
        assert client.get(reverse(name)).status_code == 200, name
    for kind, url in _run_urls(run.pk).items():
        assert client.get(url).status_code == 200, kind
    assert "owners-run" in client.get(reverse("web:run_list")).content.decode()
    assert "owners-run" in client.get(reverse("web:leaderboard")).content.decode()
    assert client.get(reverse("web:runs_status") + f"?ids={run.pk}").json()["runs"][0]["id"] == run.pk


def test_staff_sees_and_stops_any_run(run, staff_user) -> None:
    client = _client(staff_user)
    for kind, url in _run_urls(run.pk).items():
        assert client.get(url).status_code == 200, kind
    listing = client.get(reverse("web:run_list")).content.decode()
    assert "owners-run" in listing and ">owner<" in listing  # staff see the owner column
    assert client.post(reverse("web:run_stop", args=[run.pk])).status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_runs_created_from_the_page_belong_to_the_signed_in_user(other_user) -> None:
    client = _client(other_user)
    response = client.post(reverse("web:run_create"), {"mode": "yaml", "config_yaml": "name: mine\n"})
    assert response.status_code == 302
    assert Run.objects.get(name="mine").owner == other_user
