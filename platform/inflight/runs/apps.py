from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "inflight.runs"
    label = "runs"
    verbose_name = "Runs, metrics, evaluations and workers"
