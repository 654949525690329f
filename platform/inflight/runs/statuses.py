"""A run's statuses: the one list the run model's choices, the API's schema, the pages and the
`inflight` CLI's help read. Importable without Django settings (only `django.db.models`' choices
class), so the CLI uses it too."""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    CANCELLING = "cancelling", "Cancelling"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    LOST = "lost", "Lost"


TERMINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.LOST})
ACTIVE_STATUSES = frozenset({RunStatus.STARTING, RunStatus.RUNNING, RunStatus.CANCELLING})
