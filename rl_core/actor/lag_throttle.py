"""The async actor's `max_lag` bound, kept at submission: which groups may start, and which
finished groups may be written to the stream now.

Why this exists: the trainer consumes the stream in order, `samples_per_step` (S) samples
per optimizer step, so the sample at stream index p is trained at version
v + (p - c) // S, where (v, c) is the trainer's published (version, consumed). A group
submitted while the trainer was at (v, c) is sampled by weights of version >= v (the
trainer publishes only after its broadcast reached the servers), so its tokens are
trained within `max_lag` versions exactly when all its samples land at stream indices
below its *slot deadline* c + (max_lag + 1) * S. That deadline is fixed at submission:
each later step moves v and c together.

Groups do not finish in submission order (a long answer takes longer), and a group that
finishes late would land past its deadline if every group finished before it had been
written first. So a finished group is written only if every group still pending (in
flight, or finished and held) still fits before its own deadline afterwards, groups in
deadline order (earliest-deadline-first: the test that a set of deadlines can all be met).
A group that cannot go yet waits here, and the trainer waits for it, instead of the slow
(long) group being dropped as stale: dropping would bias learning against long answers.

Submission asks the same question of a new group (the latest deadline, so it goes last):
unconsumed + pending + group_size <= (max_lag + 1) * S.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Hashable, TypeVar

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")


@dataclass
class _Pending(Generic[Item]):
    deadline: int  # stream index every sample of the group must stay below
    size: int  # samples it may still write: group_size while in flight, exact once finished
    order: int  # submission order: breaks deadline ties so writes keep submission order
    samples: list[Item] | None = None  # None while in flight


@dataclass
class LagThrottle(Generic[Key, Item]):
    """Bookkeeping only (no I/O, no clock): the actor tells it what it submitted, what
    finished and where the stream and the trainer are; it answers what may start and what
    may be written."""

    max_lag: int
    samples_per_step: int
    group_size: int
    pending: dict[Key, _Pending[Item]] = field(default_factory=dict)
    submitted: int = 0

    def pending_samples(self) -> int:
        return sum(group.size for group in self.pending.values())

    def may_submit(self, written: int, consumed: int) -> bool:
        """A new group fits before its deadline even if everything pending is written first."""
        unconsumed = written - consumed
        return unconsumed + self.pending_samples() + self.group_size <= (self.max_lag + 1) * self.samples_per_step

    def on_submitted(self, key: Key, consumed: int) -> None:
        deadline = consumed + (self.max_lag + 1) * self.samples_per_step
        self.pending[key] = _Pending(deadline=deadline, size=self.group_size, order=self.submitted)
        self.submitted += 1

    def on_finished(self, key: Key, samples: list[Item]) -> None:
        group = self.pending[key]
        if len(samples) > group.size:
            raise ValueError(f"a group of {group.size} returned {len(samples)} samples")
        group.samples = list(samples)
        group.size = len(samples)

    def on_abandoned(self, key: Key) -> None:
        """A group that will never write (cancelled at the end of training)."""
        self.pending.pop(key, None)

    def take_writable(self, written: int) -> list[list[Item]]:
        """The finished groups to append to the stream now, in the order to append them.
        `written` is the stream's length before these writes."""
        out: list[list[Item]] = []
        while True:
            chosen = self._next_writable(written)
            if chosen is None:
                return out
            group = self.pending.pop(chosen)
            assert group.samples is not None
            written += len(group.samples)
            if group.samples:
                out.append(group.samples)

    def _next_writable(self, written: int) -> Key | None:
        by_deadline = sorted(self.pending.items(), key=lambda item: (item[1].deadline, item[1].order))
        if not by_deadline:
            return None
        first_key, first = by_deadline[0]
        if first.samples is not None:
            # Earliest deadline first never makes a feasible set infeasible; and once it is
            # infeasible (a resumed run, a trainer that rewound) holding back helps nobody.
            return first_key
        for key, group in by_deadline[1:]:
            if group.samples is not None and self._fits_after(key, written + group.size, by_deadline):
                return key
        return None

    @staticmethod
    def _fits_after(skip: Key, written: int, by_deadline: list[tuple[Key, _Pending[Item]]]) -> bool:
        end = written
        for key, group in by_deadline:
            if key == skip:
                continue
            end += group.size
            if end > group.deadline:
                return False
        return True
