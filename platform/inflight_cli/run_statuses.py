"""The statuses a run goes through, with their labels: one list for the platform's run model
(`inflight.runs.statuses` builds its choices from it) and the `inflight` CLI, which imports neither
Django nor the platform, so the list lives on the client's side."""

from __future__ import annotations

RUN_STATUSES: tuple[tuple[str, str], ...] = (
    ("queued", "Queued"),
    ("starting", "Starting"),
    ("running", "Running"),
    ("cancelling", "Cancelling"),
    ("succeeded", "Succeeded"),
    ("failed", "Failed"),
    ("cancelled", "Cancelled"),
    ("lost", "Lost"),
)
# A run in one of these has ended (it may be resumed); in ACTIVE_STATUSES a worker drives it.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "lost"})
ACTIVE_STATUSES = frozenset({"starting", "running", "cancelling"})
