from __future__ import annotations

from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "inflight.datasets"
    label = "datasets"
    verbose_name = "Users' own datasets (JSONL problems/answers)"
