from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "inflight.alerts"
    label = "alerts"
    verbose_name = "Run alerts and webhooks"
