"""Notifications of a user's runs: the in-app inbox entry and the webhook post.

An alert already goes to the owner's webhook (`alerts.services`); here it only gets its inbox
entry. A run that ends gets both: an inbox entry and a post to the owner's webhook, so a user
learns that a run finished or failed without keeping its page open. A run its owner cancelled is
not announced (they know). The webhook body is Slack-compatible like the alerts':
`{"text": ..., "inflight": {"event": "run_ended", ...}}`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inflight.alerts.models import Alert, AlertWebhook
from inflight.alerts.rules import RULES
from inflight.inbox.models import Notification, NotificationKind
from inflight.runs.models import Run, RunStatus

logger = logging.getLogger(__name__)
WEBHOOK_TIMEOUT_S = 5.0
# End states worth a notification; a `cancelled` run is announced only when something other than
# its owner's cancel ended it (a wall-time budget reports its own reason).
ANNOUNCED_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.LOST, RunStatus.CANCELLED})
SILENT_REASONS = frozenset({"cancelled"})
STATUS_MARKS = {RunStatus.SUCCEEDED: ":white_check_mark:", RunStatus.FAILED: ":x:", RunStatus.LOST: ":x:", RunStatus.CANCELLED: ":stop_sign:"}
MAX_MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class WebhookResult:
    """What a post to a webhook gave: `ok`, and a sentence for the user."""

    ok: bool
    said: str


def post_json(url: str, body: dict[str, Any]) -> WebhookResult:
    """POST `body` to `url` (no redirects followed: a webhook URL is the user's, not a chain)."""
    import httpx

    try:
        response = httpx.post(url, json=body, timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False)
    except httpx.HTTPError as exc:
        return WebhookResult(False, f"the webhook could not be reached: {type(exc).__name__}: {str(exc)[:200]}")
    if response.status_code >= 400:
        return WebhookResult(False, f"the webhook answered {response.status_code} {response.reason_phrase}")
    return WebhookResult(True, f"the webhook answered {response.status_code} {response.reason_phrase}")


def _post_in_background(url: str, body: dict[str, Any], what: str) -> None:
    def post() -> None:
        result = post_json(url, body)
        if not result.ok:
            logger.warning("%s: %s", what, result.said)

    # Off the worker's path: a slow or dead receiver must not hold up the run's end being recorded.
    threading.Thread(target=post, name="run-end-webhook", daemon=True).start()


def send_test(user: Any) -> WebhookResult:
    """Post a test message to `user`'s saved webhook now and say what it answered."""
    hook = AlertWebhook.objects.filter(user=user).first()
    if hook is None:
        return WebhookResult(False, "no webhook is saved: enter a URL and save it first")
    if not settings.INFLIGHT_ALERT_WEBHOOKS:
        return WebhookResult(False, "the operator has switched webhooks off (INFLIGHT_ALERT_WEBHOOKS=0): nothing was sent")
    body = {"text": f":wave: Inflight test message for {user.get_username()}: this webhook receives your runs' alerts and ends.",
            "inflight": {"event": "test", "user": user.get_username()}}
    return post_json(hook.url, body)


def run_ended_title(run: Run) -> str:
    return f"Run #{run.pk} {run.name} {run.get_status_display().lower()}"


def run_ended_message(run: Run) -> str:
    detail = getattr(run, "ended_detail", "") or ""
    error = (run.error or "").strip().splitlines()[0] if (run.error or "").strip() else ""
    parts = [part for part in (detail, error if error not in detail else "") if part]
    return "; ".join(parts)[:MAX_MESSAGE_CHARS]


def is_announced(run: Run) -> bool:
    if run.status not in ANNOUNCED_STATUSES:
        return False
    reason = getattr(run, "ended_reason", "") or ""
    if run.status == RunStatus.CANCELLED and (not reason or reason in SILENT_REASONS):
        return False
    return reason not in SILENT_REASONS


def notify_run_ended(run_id: int) -> Notification | None:
    """The inbox entry and webhook post of a run that just reached an end state (called after the
    transition committed, so `ended_reason`/`ended_detail` written with it are read here)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not is_announced(run):
        return None
    entry = Notification.objects.create(user_id=run.owner_id, run=run, kind=NotificationKind.RUN_ENDED,
                                        title=run_ended_title(run), message=run_ended_message(run))
    if settings.INFLIGHT_ALERT_WEBHOOKS:
        hook = AlertWebhook.objects.filter(user_id=run.owner_id, enabled=True).first()
        if hook is not None:
            body = {
                "text": f"{STATUS_MARKS.get(run.status, '')} Inflight {entry.title}" + (f": {entry.message}" if entry.message else ""),
                "inflight": {"event": "run_ended", "run": run.pk, "name": run.name, "status": run.status,
                             "ended_reason": getattr(run, "ended_reason", "") or None, "ended_detail": getattr(run, "ended_detail", "") or None,
                             "error": run.error or None},
            }
            _post_in_background(hook.url, body, f"run-end webhook of run {run.pk}")
    return entry


def record_alert(alert: Alert) -> Notification:
    """The inbox entry of a stored alert (its webhook post is the alert service's)."""
    run = Run.objects.only("id", "owner_id", "name").get(pk=alert.run_id)
    title = f"Run #{run.pk} {run.name}: {RULES.get(alert.rule, alert.rule)}" + (f" at step {alert.step}" if alert.step is not None else "")
    return Notification.objects.create(user_id=run.owner_id, run_id=run.pk, kind=NotificationKind.ALERT, alert=alert,
                                       title=title[:200], message=alert.message[:MAX_MESSAGE_CHARS])


def unread_count(user: Any) -> int:
    return Notification.objects.filter(user=user, read_at__isnull=True).count()


def mark_read(user: Any, ids: list[int] | None = None) -> int:
    """Mark `user`'s entries read (all of them when `ids` is None); another user's ids are ignored."""
    entries = Notification.objects.filter(user=user, read_at__isnull=True)
    if ids is not None:
        entries = entries.filter(pk__in=ids)
    with transaction.atomic():
        return entries.update(read_at=timezone.now())
