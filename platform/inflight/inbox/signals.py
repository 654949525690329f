"""Inbox entries from the saves that mean something happened to a user's run: a stored `Alert`,
and a `Run` saved into an end state (`runs.services.transition_run` saves with update_fields).
Both act after the commit, so a rolled-back write announces nothing."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from inflight.alerts.models import Alert
from inflight.runs.models import TERMINAL_STATUSES, Run

logger = logging.getLogger(__name__)


def _safely(what: str, action: Any) -> None:
    # A notification must never undo or fail the write it reports (the run's end, the alert).
    try:
        action()
    except Exception:  # noqa: BLE001
        logger.exception("inbox: %s failed", what)


@receiver(post_save, sender=Alert, dispatch_uid="inbox-alert")
def alert_stored(sender: type[Alert], instance: Alert, created: bool, **kwargs: Any) -> None:
    if created:
        from inflight.inbox.services import record_alert

        transaction.on_commit(lambda: _safely(f"alert {instance.pk}", lambda: record_alert(instance)))


@receiver(post_save, sender=Run, dispatch_uid="inbox-run-ended")
def run_saved(sender: type[Run], instance: Run, created: bool, update_fields: Any = None, **kwargs: Any) -> None:
    if created or update_fields is None or "status" not in update_fields or instance.status not in TERMINAL_STATUSES:
        return
    from inflight.inbox.services import notify_run_ended

    run_id = instance.pk
    transaction.on_commit(lambda: _safely(f"run {run_id} end", lambda: notify_run_ended(run_id)))
