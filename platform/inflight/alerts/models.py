"""Alerts raised by the built-in rules (`alerts.rules`) and where users want them sent.

An alert fires once per episode: `AlertEpisode.active` is set when a rule's condition starts
holding and cleared when it stops, and only the false → true edge stores an `Alert`.
`AlertCursor` remembers which metrics.jsonl lines were already evaluated (a re-sent batch is
not evaluated twice) and the rolling windows the collapse rules need.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from inflight.runs.models import Run


class Alert(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    rule = models.CharField(max_length=40, help_text="Rule that fired (alerts.rules.RULES).")
    key = models.CharField(max_length=120, blank=True, default="", help_text="What the rule watched, e.g. a benchmark.")
    step = models.BigIntegerField(null=True, blank=True, help_text="Trainer step where it fired.")
    t = models.FloatField(help_text="Unix seconds when it fired.")
    message = models.TextField()
    values = models.JSONField(default=dict, help_text="The values that made it fire (and the threshold).")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["run", "-id"], name="alert_run_id")]


class AlertEpisode(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    rule = models.CharField(max_length=40)
    key = models.CharField(max_length=120, blank=True, default="")
    active = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "rule", "key"], name="alertepisode_run_rule_key")]


class AlertCursor(models.Model):
    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="+")
    next_line = models.BigIntegerField(default=0, help_text="metrics.jsonl lines below this were evaluated.")
    windows = models.JSONField(default=dict, help_text="Rolling values of the collapse rules: {metric: {values, best}}.")


class AlertWebhook(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="alert_webhook")
    url = models.URLField(max_length=500, help_text="Slack-compatible incoming webhook: alerts are POSTed as JSON {\"text\": ...}.")
    enabled = models.BooleanField(default=True)
