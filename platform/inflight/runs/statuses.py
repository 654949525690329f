"""A run's statuses as the model's choices (`RunStatus.QUEUED`, ...), built from the one list in
`inflight_cli.run_statuses`, which the CLI (no Django there) reads too: the API's schema, the
pages and `inflight runs --status` name the same eight."""

from __future__ import annotations

from django.db import models

from inflight_cli import run_statuses

RunStatus = models.TextChoices("RunStatus", [(value.upper(), (value, label)) for value, label in run_statuses.RUN_STATUSES])  # type: ignore[misc]

TERMINAL_STATUSES = frozenset(RunStatus(value) for value in run_statuses.TERMINAL_STATUSES)
ACTIVE_STATUSES = frozenset(RunStatus(value) for value in run_statuses.ACTIVE_STATUSES)
