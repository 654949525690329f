"""Who may do what on every API route: owner, another user, staff, anonymous, bad tokens."""

from __future__ import annotations

import pytest

from inflight.accounts.services import create_token
from inflight.runs import services
from inflight.runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db

RUN_ROUTES = [
    ("get", "/api/runs/{id}/"),
    ("get", "/api/runs/{id}/metrics/"),
    ("get", "/api/runs/{id}/metrics/?since_seq=0"),
    ("get", "/api/runs/{id}/evals/"),
    ("post", "/api/runs/{id}/cancel/"),
]
ALL_ROUTES = RUN_ROUTES + [("get", "/api/runs/"), ("post", "/api/runs/"), ("get", "/api/leaderboard/"), ("get", "/api/workers/")]


@pytest.fixture
def run(owner) -> Run:
    return services.create_run(owner, "perm", {})


def call(client, method, url):
    if method == "post":
        return client.post(url, "{}", content_type="application/json")
    return client.get(url)


@pytest.mark.parametrize(("method", "url"), ALL_ROUTES)
def test_anonymous_is_401_everywhere(anonymous_api, run, method, url) -> None:
    response = call(anonymous_api, method, url.format(id=run.pk))
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


@pytest.mark.parametrize("header", ["Token nope", "Bearer x", "Token", "", "token "])
def test_bad_tokens_are_401(client, run, header) -> None:
    response = client.get("/api/runs/", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401


def test_inactive_users_token_is_refused(owner, run) -> None:
    from django.test import Client

    key = create_token(owner).key
    owner.is_active = False
    owner.save()
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 401


@pytest.mark.parametrize(("method", "url"), RUN_ROUTES)
def test_other_user_gets_404_and_changes_nothing(other_api, run, method, url) -> None:
    response = call(other_api, method, url.format(id=run.pk))
    assert response.status_code == 404
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


def test_other_user_lists_only_their_own(other_api, run) -> None:
    assert other_api.get("/api/runs/").json()["runs"] == []
    assert other_api.get("/api/leaderboard/").json()["rows"] == []


@pytest.mark.parametrize(("method", "url"), RUN_ROUTES)
def test_owner_and_staff_may_use_every_run_route(owner_api, staff_api, run, method, url) -> None:
    for client in (owner_api, staff_api):
        response = call(client, method, url.format(id=run.pk))
        assert response.status_code in (200, 409), (url, response.content)  # 409: cancelled already


def test_staff_sees_and_cancels_others_runs(staff_api, run) -> None:
    assert [r["id"] for r in staff_api.get("/api/runs/").json()["runs"]] == [run.pk]
    response = staff_api.post(f"/api/runs/{run.pk}/cancel/")
    assert response.status_code == 200 and Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def test_unknown_run_is_404(owner_api) -> None:
    assert owner_api.get("/api/runs/999999/").status_code == 404
