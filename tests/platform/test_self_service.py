"""Issue 33, self-service (Django's test client on the real PostgreSQL): a user makes and revokes
their own API tokens, tests their webhook, is told (inbox + webhook) when a run ends and of every
alert, across runs, read or unread; nobody reaches another user's tokens or inbox."""

from __future__ import annotations

import re

import pytest

from inflight.alerts import services as alerts
from inflight.alerts.models import AlertWebhook
from inflight.inbox.models import Notification, NotificationKind
from inflight.runs import services as runs
from inflight.runs.models import Run
from tests.platform.test_alerts import lines, make_run, receiver  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.django_db(transaction=True)

KEY_RE = re.compile(r'id="new-token-key">([0-9a-f]{40})<')


def test_a_user_makes_and_revokes_their_own_token(owner_web, other_web, anonymous_api) -> None:
    assert anonymous_api.get("/settings/account/").status_code == 302  # sign-in required
    page = owner_web.get("/settings/account/")
    assert page.status_code == 200 and "No token yet" in page.content.decode()

    made = owner_web.post("/settings/account/", {"name": "laptop", "days": "30"})
    assert made.status_code == 302
    shown = owner_web.get("/settings/account/").content.decode()
    key = KEY_RE.search(shown).group(1)
    assert "laptop" in shown and key[:8] in shown
    assert KEY_RE.search(owner_web.get("/settings/account/").content.decode()) is None  # shown once

    api = {"HTTP_AUTHORIZATION": f"Token {key}"}
    assert anonymous_api.get("/api/runs/", **api).status_code == 200
    token_id = owner_web.get("/settings/account/").context["tokens"][0].pk

    # Another user cannot revoke it (nor learn that it exists): the token keeps working.
    refused = other_web.post(f"/settings/account/tokens/{token_id}/revoke/", follow=True)
    assert "You have no token" in refused.content.decode()
    assert anonymous_api.get("/api/runs/", **api).status_code == 200

    done = owner_web.post(f"/settings/account/tokens/{token_id}/revoke/", follow=True)
    assert "revoked" in done.content.decode()
    assert anonymous_api.get("/api/runs/", **api).status_code == 401


def test_a_bad_token_form_names_the_field_and_makes_nothing(owner_web, owner) -> None:
    response = owner_web.post("/settings/account/", {"name": "  ", "days": "100000"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "This field is required" in body and "Select a valid choice" in body
    assert not owner.api_tokens.exists()


def test_send_a_test_posts_to_the_saved_webhook_and_says_what_it_answered(owner_web, owner, receiver, settings) -> None:  # noqa: F811
    settings.INFLIGHT_ALERT_WEBHOOKS = True
    nothing = owner_web.post("/settings/alerts/test/", follow=True).content.decode()
    assert "no webhook is saved" in nothing
    AlertWebhook.objects.create(user=owner, url=receiver.url)
    sent = owner_web.post("/settings/alerts/test/", follow=True).content.decode()
    assert "the webhook answered 200" in sent
    body = receiver.wait_for(1)[0]
    assert body["inflight"]["event"] == "test" and "owner" in body["text"]
    page = owner_web.get("/settings/alerts/").content.decode()
    assert 'action="/settings/alerts/test/"' in page  # the button is on the settings page

    AlertWebhook.objects.filter(user=owner).update(url="http://127.0.0.1:9/nothing-listens")
    failed = owner_web.post("/settings/alerts/test/", follow=True).content.decode()
    assert "could not be reached" in failed


def test_a_run_that_ends_is_announced_in_the_inbox_and_to_the_webhook(owner, receiver, settings, django_capture_on_commit_callbacks) -> None:  # noqa: F811
    settings.INFLIGHT_ALERT_WEBHOOKS = True
    AlertWebhook.objects.create(user=owner, url=receiver.url)
    good = Run.objects.create(owner=owner, name="good", config={}, status="running")
    bad = Run.objects.create(owner=owner, name="bad", config={}, status="running")
    mine_cancelled = Run.objects.create(owner=owner, name="stopped", config={}, status="cancelling")
    with django_capture_on_commit_callbacks(execute=True):
        runs.finish_run(good.pk, "succeeded")
        runs.finish_run(bad.pk, "failed", "trainer exited with code 1\nmore lines")
        runs.finish_run(mine_cancelled.pk, "cancelled")
    entries = {n.run_id: n for n in Notification.objects.filter(user=owner, kind=NotificationKind.RUN_ENDED)}
    assert set(entries) == {good.pk, bad.pk}  # the owner's own cancel is not announced
    assert entries[good.pk].title == f"Run #{good.pk} good succeeded" and entries[good.pk].unread
    assert "trainer exited with code 1" in entries[bad.pk].message
    bodies = receiver.wait_for(2)
    assert sorted((b["inflight"]["run"], b["inflight"]["status"]) for b in bodies) == [(good.pk, "succeeded"), (bad.pk, "failed")]
    assert all(b["inflight"]["event"] == "run_ended" and b["text"] for b in bodies)


def test_alerts_land_in_the_owners_inbox_across_runs(owner, other_user, owner_web, other_web, django_capture_on_commit_callbacks) -> None:
    first, second = make_run(owner), make_run(owner)
    with django_capture_on_commit_callbacks(execute=True):
        alerts.evaluate_metric_lines(first.pk, lines(0, {"step": 1, "nonfinite/train/loss": 1.0}))
        alerts.evaluate_metric_lines(second.pk, lines(0, {"step": 3, "nonfinite/train/grad_norm": 1.0}))
        runs.finish_run(second.pk, "failed", "boom")
    page = owner_web.get("/inbox/").content.decode()
    assert f"#{first.pk} alerting" in page and f"#{second.pk} alerting" in page and "boom" in page
    assert page.count('data-unread="1"') == 3 and "3 unread" in page
    assert 'class="badge"' in page  # the nav's count

    # The other user sees none of it and cannot mark it read.
    assert "Nothing yet" in other_web.get("/inbox/").content.decode()
    ids = list(Notification.objects.filter(user=owner).values_list("pk", flat=True))
    other_web.post("/inbox/read/", {"id": [str(i) for i in ids]})
    assert Notification.objects.filter(user=owner, read_at__isnull=True).count() == 3

    owner_web.post("/inbox/read/", {"id": [str(ids[0])]})
    unread = owner_web.get("/inbox/?show=unread").content.decode()
    assert unread.count('data-unread="1"') == 2 and "2 unread" in unread
    owner_web.post("/inbox/read/")
    assert "Nothing unread" in owner_web.get("/inbox/?show=unread").content.decode()
    assert 'class="badge"' not in owner_web.get("/inbox/").content.decode()
