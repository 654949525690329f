from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "inflight.api"
    label = "api"
    verbose_name = "JSON API"
