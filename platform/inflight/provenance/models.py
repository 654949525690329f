"""A run's launches as the engine recorded them (`rl_core.launch.provenance`, the run directory's
provenance.jsonl), stored by the worker so the run page and compare read them from the database."""

from __future__ import annotations

from django.db import models

from inflight.runs.models import Run


class RunProvenance(models.Model):
    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, related_name="+")
    launches = models.JSONField(default=list, help_text="provenance.jsonl's records, oldest first: one per launch (the first, then each resume).")
    updated_at = models.DateTimeField(auto_now=True)
