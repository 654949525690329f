"""A user's inbox: one entry per alert of their runs and per run that ended (succeeded, failed,
lost), read or unread. Entries are written by `inbox.signals` when an `Alert` is stored or a run
reaches an end state, so neither the alert rules nor the run state machine know about them."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from inflight.runs.models import Run


class NotificationKind(models.TextChoices):
    ALERT = "alert", "Alert"
    RUN_ENDED = "run_ended", "Run ended"


class Notification(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", help_text="The run it is about.")
    kind = models.CharField(max_length=20, choices=NotificationKind.choices)
    alert = models.OneToOneField("alerts.Alert", on_delete=models.CASCADE, null=True, blank=True, related_name="+",
                                 help_text="The alert, for kind 'alert'.")
    title = models.CharField(max_length=200, help_text="One line: what happened.")
    message = models.TextField(blank=True, default="", help_text="The alert's message, or why the run ended.")
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True, help_text="When the user marked it read (empty: unread).")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["user", "-id"], name="notification_user_id"),
                   models.Index(fields=["user", "read_at"], name="notification_user_read")]

    @property
    def unread(self) -> bool:
        return self.read_at is None
