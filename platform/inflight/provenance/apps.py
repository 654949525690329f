from __future__ import annotations

from django.apps import AppConfig


class ProvenanceConfig(AppConfig):
    name = "inflight.provenance"
    label = "provenance"
    verbose_name = "What ran each run (code version, packages, host, command)"
