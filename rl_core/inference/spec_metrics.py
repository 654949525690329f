"""The `spec/*` metrics of HistoSpec, from an engine's cumulative draft counters.

The engine (`inference/speculation.py` drafts, the engine verifies) counts drafted and accepted tokens
and verify steps; a server reports those totals (`/health` "counters", `/metrics`). Whoever
polls the servers (the actor) turns two readings into metrics here. Kept apart from
`inference/speculation.py` so that a poller needs nothing of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass
class SpeculationStats:
    """Counters behind the `spec/*` metrics; the engine adds one verify step at a time."""

    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0  # steps that carried a non-empty draft

    def record(self, drafted: int, accepted: int) -> None:
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted ({accepted}) must be within 0..drafted ({drafted})")
        if drafted == 0:
            return
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        self.verify_steps += 1

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """`spec/acceptance_rate` (accepted / drafted), `spec/mean_accepted_len` (accepted per
        drafting step), `spec/drafted_tokens`; empty when nothing was drafted."""
        out: dict[str, float] = {}
        if self.drafted_tokens:
            out["spec/acceptance_rate"] = self.accepted_tokens / self.drafted_tokens
            out["spec/mean_accepted_len"] = self.accepted_tokens / self.verify_steps
            out["spec/drafted_tokens"] = float(self.drafted_tokens)
        if reset:
            self.drafted_tokens = self.accepted_tokens = self.verify_steps = 0
        return out


def spec_metrics_from_counters(
    current: Mapping[str, float], previous: Mapping[str, float] | None = None
) -> dict[str, float]:
    """`spec/*` metrics between two readings of an engine's cumulative counters
    (`spec_drafted_tokens`, `spec_accepted_tokens`, `spec_verify_steps` — `ReferenceEngine.stats()`
    or a server's `/metrics`), so whoever polls a server can log them; empty when nothing was drafted."""
    previous = previous or {}
    stats = SpeculationStats()

    def delta(key: str) -> int:
        return int(current.get(key, 0)) - int(previous.get(key, 0))

    drafted, accepted, steps = delta("spec_drafted_tokens"), delta("spec_accepted_tokens"), delta("spec_verify_steps")
    if drafted <= 0:
        return {}
    stats.drafted_tokens, stats.accepted_tokens, stats.verify_steps = drafted, accepted, max(steps, 1)
    return stats.metrics()
