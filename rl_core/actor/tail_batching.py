"""Which rollouts wait: RollPacker's tail batching, in sync rounds and in the async window.

- `TailBatchPlanner` plans sync-mode rounds: short rounds over-provision prompts and responses
  and keep the first that finish; the prompts that did not finish go to a long-tail queue, and
  once it holds a full batch the next round is a long round of exactly those. With history
  (`LongTailHistory`, RhymeRL's observation that a prompt's lengths repeat from epoch to epoch),
  a prompt known long skips short rounds from its second epoch on, and a prompt known short
  that a short round cut retries once in the next short round.
- `AsyncTailTracker` applies the same idea to the async actor's rolling window.

Response over-provisioning (keep a group's first G of 1.25 G) is RollPacker's, and available, but
off by default: the first finishers are the short answers, which biases training wherever length
and reward are related; deferring a whole prompt does not (it trains later on a fresh group).

Nothing here touches torch or the network: these are pure bookkeeping objects, driven by the
actor with prompt ids and finished-response events.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from rl_core.config.run_config import RunConfig, TailBatchingConfig

RoundKind = Literal["short", "long", "plain"]


@dataclass
class RoundOutcome:
    """What a closed round produced. `kept[prompt_id]` lists the response keys to train (exactly
    `group_size` each); `deferred` prompts went to the long-tail queue; `aborted` counts the
    launched responses that had not finished when the round closed."""

    kind: RoundKind
    kept: dict[str, list[int]]
    deferred: list[str]
    aborted: int


@dataclass
class TailRound:
    """One sync-mode round. The actor launches `responses_per_prompt` requests (response keys
    0..responses_per_prompt-1, one request each so they can finish one by one) for every
    prompt in `prompt_ids`, reports each finished response with `on_response`, and when `done`
    aborts every request still running and calls `TailBatchPlanner.close_round`."""

    index: int
    kind: RoundKind
    prompt_ids: list[str]
    responses_per_prompt: int
    keep_prompts: int
    keep_responses: int
    _finished: dict[str, list[int]] = field(default_factory=dict)  # kept response keys per prompt
    _reported: dict[str, set[int]] = field(default_factory=dict)  # every reported key, to refuse repeats
    _complete_order: list[str] = field(default_factory=list)
    _lengths: dict[str, list[int]] = field(default_factory=dict)  # token counts of kept responses, when reported
    _finished_count: int = 0
    closed: bool = False

    @property
    def done(self) -> bool:
        return len(self._complete_order) >= self.keep_prompts

    @property
    def launched(self) -> int:
        return len(self.prompt_ids) * self.responses_per_prompt

    def on_response(self, prompt_id: str, response_key: int, length: int | None = None) -> bool:
        """A response finished (`length`: its token count, which lets the planner remember which
        prompts run long). True: hold on to it — it is one of its prompt's first
        `keep_responses`, and it is trained if its prompt is kept (`RoundOutcome.kept` is the final
        word; a prompt still incomplete when the round is done is deferred and its partial
        answers dropped). False: surplus — an extra response of a complete prompt, or one that
        arrived after the round was done; discard it."""
        if prompt_id not in self._reported and prompt_id not in self.prompt_ids:
            raise KeyError(f"prompt {prompt_id!r} is not part of round {self.index}")
        if not 0 <= response_key < self.responses_per_prompt:
            raise ValueError(f"response_key {response_key} outside 0..{self.responses_per_prompt - 1}")
        reported = self._reported.setdefault(prompt_id, set())
        if response_key in reported:
            raise ValueError(f"response {response_key} of {prompt_id!r} reported twice in round {self.index}")
        reported.add(response_key)
        finished = self._finished.setdefault(prompt_id, [])
        if self.closed or self.done:
            return False
        self._finished_count += 1
        if len(finished) >= self.keep_responses:
            return False
        finished.append(response_key)
        if length is not None:
            self._lengths.setdefault(prompt_id, []).append(int(length))
        if len(finished) == self.keep_responses:
            self._complete_order.append(prompt_id)
        return True

    def prompts_to_abort(self) -> list[str]:
        """Prompts whose unfinished requests can be aborted now: every complete prompt's extras,
        and once the round is done, everything."""
        if self.done:
            return list(self.prompt_ids)
        return list(self._complete_order)


class LongTailHistory:
    """Which prompts were long-tail the last time they ran whole: RhymeRL's observation (a
    prompt's response lengths repeat from one epoch to the next) applied to RollPacker's queue.
    From its second epoch on, such a prompt can go straight to the long-tail queue instead of
    taking a short-round slot where it would only decode until it is aborted and deferred again.

    A prompt is long when its last kept group's median length exceeded `long_factor` × the median
    of recent groups' medians. Being deferred alone does not count: a short round defers its
    slowest fifth even when no prompt is long, and the prompt's group in the long round then
    says what it really is. Before `min_groups` groups were seen, nothing counts as long."""

    def __init__(self, long_factor: float = 2.0, window: int = 512, min_groups: int = 8) -> None:
        if long_factor <= 1.0:
            raise ValueError(f"long_factor must be > 1, got {long_factor}")
        self.long_factor = long_factor
        self.min_groups = min_groups
        self.last_median: dict[str, float] = {}
        self.recent_medians: deque[float] = deque(maxlen=window)
        self._threshold: float | None = None

    def threshold(self) -> float | None:
        """The median length above which a group counts as long (None until `min_groups`)."""
        return self._threshold

    def is_long(self, prompt_id: str) -> bool:
        threshold, median = self._threshold, self.last_median.get(prompt_id)
        return threshold is not None and median is not None and median > threshold

    def is_short(self, prompt_id: str) -> bool:
        """Known, and not long (a prompt never seen whole is neither)."""
        threshold, median = self._threshold, self.last_median.get(prompt_id)
        return threshold is not None and median is not None and median <= threshold

    def record_group(self, prompt_id: str, lengths: Sequence[int]) -> None:
        """A kept group of `prompt_id` with these response token counts (empty: nothing learnt)."""
        if not lengths:
            return
        median = statistics.median_low(lengths)
        self.last_median[prompt_id] = float(median)
        self.recent_medians.append(float(median))
        if len(self.recent_medians) >= self.min_groups:
            self._threshold = self.long_factor * statistics.median_low(self.recent_medians)


class TailBatchPlanner:
    """Plans sync-mode rounds and owns the long-tail queue.

    Invariant (tested over random finish orders): every prompt drawn from `draw_fresh` is
    trained at most once, and at any time is either trained, in the long-tail queue, waiting to
    retry (known short, cut once by a short round), or in the open round. With tail batching off, rounds are plain: `batch_prompts` fresh prompts
    with `group_size` responses and nothing aborted, so the actor code is the same either way."""

    def __init__(self, batch_prompts: int, group_size: int, config: TailBatchingConfig) -> None:
        if batch_prompts < 1:
            raise ValueError(f"batch_prompts must be >= 1, got {batch_prompts}")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.batch_prompts = batch_prompts
        self.group_size = group_size
        self.config = config
        self.long_tail: deque[str] = deque()
        self.rounds_planned = 0
        self.open_round: TailRound | None = None
        self.history = LongTailHistory(long_factor=config.history_long_factor)
        # Deferred prompts the history knows as short (cut by the over-provisioning, not by their
        # length) retry in the next short round once, instead of taking a long round's slot.
        self.retry: deque[str] = deque()
        self._retried: set[str] = set()
        self._deferred_from_history = 0
        self._last: dict[str, float] = {}

    def _draw_short_round_prompts(self, draw_fresh: Callable[[int], Sequence[str]], wanted: int) -> list[str]:
        """`wanted` fresh prompts for a short round; with `defer_from_history`, drawn prompts the
        history knows as long-tail join the long-tail queue instead (and more are drawn, at most
        4 × wanted in all, so a data set of only long prompts cannot spin here)."""
        if not self.config.defer_from_history:
            return list(draw_fresh(wanted))
        prompts: list[str] = []
        while self.retry and len(prompts) < wanted:
            prompts.append(self.retry.popleft())
        drawn = 0
        while len(prompts) < wanted and drawn < 4 * wanted:
            fresh = list(draw_fresh(wanted - len(prompts)))
            if not fresh:
                break
            drawn += len(fresh)
            for prompt_id in fresh:
                if not self.history.is_long(prompt_id):
                    prompts.append(prompt_id)
                    continue
                if prompt_id in self.long_tail:
                    raise ValueError(f"prompt {prompt_id!r} drawn while it is already in the long-tail queue")
                self.long_tail.append(prompt_id)
                self._deferred_from_history += 1
        return prompts

    def plan_round(self, draw_fresh: Callable[[int], Sequence[str]]) -> TailRound:
        """The next round. `draw_fresh(k)` returns up to k new prompt ids (fewer when the data
        ends). A long round is planned when the long-tail queue holds a full batch."""
        if self.open_round is not None:
            raise RuntimeError(f"round {self.open_round.index} is still open: close_round() it first")
        if not self.config.enabled:
            prompts = list(draw_fresh(self.batch_prompts))
            kind: RoundKind = "plain"
            per_prompt, keep = self.group_size, len(prompts)
        elif len(self.long_tail) >= self.batch_prompts:
            prompts = [self.long_tail.popleft() for _ in range(self.batch_prompts)]
            kind, per_prompt, keep = "long", self.group_size, len(prompts)
        else:
            wanted = math.ceil(self.batch_prompts * self.config.prompt_overprovision)
            prompts = self._draw_short_round_prompts(draw_fresh, wanted)
            if prompts or not (self.long_tail or self.retry):
                kind = "short"
                per_prompt = math.ceil(self.group_size * self.config.response_overprovision)
                keep = min(self.batch_prompts, len(prompts))
            else:  # every drawn prompt was known long-tail, or the data ended: run the queue instead
                flush = self.plan_flush_round()
                assert flush is not None  # the queue or the retries hold a prompt
                return flush
        return self._open(kind, prompts, per_prompt, keep)

    def _open(self, kind: RoundKind, prompts: list[str], per_prompt: int, keep: int) -> TailRound:
        if len(set(prompts)) != len(prompts):
            raise ValueError(f"round {self.rounds_planned} would hold a prompt twice: {prompts}")
        round_ = TailRound(
            index=self.rounds_planned,
            kind=kind,
            prompt_ids=prompts,
            responses_per_prompt=per_prompt,
            keep_prompts=keep,
            keep_responses=self.group_size,
        )
        self.rounds_planned += 1
        self.open_round = round_
        return round_

    def plan_flush_round(self) -> TailRound | None:
        """A long round of whatever is left in the long-tail queue (fewer than a batch), for the
        end of a run or data; None when the queue is empty."""
        if self.open_round is not None:
            raise RuntimeError(f"round {self.open_round.index} is still open: close_round() it first")
        self.long_tail.extend(self.retry)  # the end: no short round is coming for them to retry in
        self.retry.clear()
        if not self.long_tail:
            return None
        prompts = [self.long_tail.popleft() for _ in range(min(self.batch_prompts, len(self.long_tail)))]
        return self._open("long", prompts, self.group_size, len(prompts))

    def close_round(self, round_: TailRound) -> RoundOutcome:
        """Close the open round: the first `keep_prompts` complete prompts are the batch, every
        other prompt of the round goes (without its partial answers) to the long-tail queue — or,
        when history knows it as short and it has not retried yet, to the next short round."""
        if round_ is not self.open_round:
            raise RuntimeError(f"round {round_.index} is not the open round")
        if round_.kind != "short" and not round_.done:
            raise RuntimeError(
                f"{round_.kind} round {round_.index} closed before all {round_.keep_prompts} prompts finished"
            )
        round_.closed = True
        kept_ids = round_._complete_order[: round_.keep_prompts]
        kept = {prompt_id: list(round_._finished[prompt_id]) for prompt_id in kept_ids}
        kept_set = set(kept_ids)
        deferred = [prompt_id for prompt_id in round_.prompt_ids if prompt_id not in kept_set]
        for prompt_id in deferred:
            if self.config.defer_from_history and self.history.is_short(prompt_id) and prompt_id not in self._retried:
                self._retried.add(prompt_id)
                self.retry.append(prompt_id)
            else:
                self._retried.discard(prompt_id)
                self.long_tail.append(prompt_id)
        self._retried.difference_update(kept_ids)
        for prompt_id in kept_ids:
            self.history.record_group(prompt_id, round_._lengths.get(prompt_id, []))
        aborted = round_.launched - round_._finished_count
        self.open_round = None
        self._last = {
            "sched/round": 1.0 if round_.kind == "long" else 0.0,
            "sched/aborted": float(aborted),
            "sched/long_tail_queue": float(len(self.long_tail)),
            "sched/deferred_from_history": float(self._deferred_from_history),
        }
        self._deferred_from_history = 0
        return RoundOutcome(kind=round_.kind, kept=kept, deferred=deferred, aborted=aborted)

    def pending(self) -> list[str]:
        """Prompts drawn but not trained yet (long-tail queue and retries), e.g. to report at the end of a run."""
        return list(self.long_tail) + list(self.retry)

    def metrics(self) -> dict[str, float]:
        """`sched/round` (0 short/plain, 1 long), `sched/aborted`, `sched/long_tail_queue` of the last closed round."""
        return dict(self._last)


def make_tail_planner(config: RunConfig, batch_prompts: int | None = None) -> TailBatchPlanner:
    """The sync-mode planner of a run: `batch_prompts` prompts × `actor.group_size` responses per
    batch; by default the prompts of one sync batch, `sync_steps_per_batch × samples_per_step / group_size`."""
    if batch_prompts is None:
        samples = config.sync_steps_per_batch * config.trainer.samples_per_step
        batch_prompts = max(1, samples // config.actor.group_size)
    return TailBatchPlanner(batch_prompts, config.actor.group_size, config.accelerations.tail_batching)


def make_async_tail_tracker(config: RunConfig) -> AsyncTailTracker:
    """The async actor's tracker: a window of `actor.groups_in_flight` groups of `actor.group_size`."""
    return AsyncTailTracker(config.actor.groups_in_flight, config.actor.group_size, config.accelerations.tail_batching)


@dataclass
class _AsyncGroup:
    prompt_id: str
    kind: RoundKind
    launch_seq: int
    kept: int = 0
    overtaken: int = 0


class AsyncTailTracker:
    """Tail batching for the async actor's rolling window of `window` groups in flight.

    The sync round's rule "launch 1.25× the prompts, keep the first that finish" becomes, for
    a rolling window: a short group that is overtaken — more than `(prompt_overprovision − 1) ×
    window` groups launched *after* it complete while it is still unfinished — is deferred: the
    actor aborts it and its prompt joins the long-tail queue. Short groups launch
    `response_overprovision × group_size` responses and keep the first `group_size`. Once the
    queue holds a full window, the next prompts are those long-tail ones, launched with exactly
    `group_size` responses and never deferred, so they decode side by side."""

    def __init__(self, window: int, group_size: int, config: TailBatchingConfig) -> None:
        if window < 1 or group_size < 1:
            raise ValueError(f"window and group_size must be >= 1, got {window}, {group_size}")
        self.window = window
        self.group_size = group_size
        self.config = config
        self.overtake_limit = max(1, math.ceil((config.prompt_overprovision - 1.0) * window))
        self.long_tail: deque[str] = deque()
        self._groups: dict[str, _AsyncGroup] = {}
        self._launched = 0
        self._deferred_total = 0
        self._aborted_since_metrics = 0
        self._last_kind = 0.0

    def next_prompt(self, draw_fresh: Callable[[int], Sequence[str]]) -> tuple[str, RoundKind] | None:
        """The next prompt to launch and its kind, or None when the data has run out."""
        if self.config.enabled and len(self.long_tail) >= self.window:
            return self.long_tail.popleft(), "long"
        fresh = list(draw_fresh(1))
        if fresh:
            return fresh[0], ("short" if self.config.enabled else "plain")
        if self.config.enabled and self.long_tail:
            # The data has run out: what is left in the queue runs as long groups.
            return self.long_tail.popleft(), "long"
        return None

    def responses_for(self, kind: RoundKind) -> int:
        if kind == "short":
            return math.ceil(self.group_size * self.config.response_overprovision)
        return self.group_size

    def launch(self, group_id: str, prompt_id: str, kind: RoundKind) -> int:
        """Register a launched group; returns how many responses to request for it."""
        if group_id in self._groups:
            raise ValueError(f"group {group_id!r} launched twice")
        self._groups[group_id] = _AsyncGroup(prompt_id, kind, self._launched)
        self._launched += 1
        self._last_kind = 1.0 if kind == "long" else 0.0
        return self.responses_for(kind)

    def on_response(self, group_id: str) -> tuple[bool, list[str]]:
        """A response of `group_id` finished. Returns (keep it, group ids to abort now). When the
        group reaches `group_size` it is complete (the actor aborts its surplus requests) and
        older short groups it overtook may be deferred — they are in the returned list too."""
        group = self._groups.get(group_id)
        if group is None or group.kept >= self.group_size:
            return False, []
        group.kept += 1
        if group.kept < self.group_size:
            return True, []
        del self._groups[group_id]
        surplus = self.responses_for(group.kind) - self.group_size  # still running: exactly G have finished
        to_abort = [group_id] if surplus > 0 else []
        self._aborted_since_metrics += surplus
        if self.config.enabled:
            for other_id, other in list(self._groups.items()):
                if other.kind == "short" and other.launch_seq < group.launch_seq:
                    other.overtaken += 1
                    if other.overtaken > self.overtake_limit:
                        to_abort.append(other_id)
                        self._defer(other_id)
        return True, to_abort

    def _defer(self, group_id: str) -> None:
        group = self._groups.pop(group_id)
        self.long_tail.append(group.prompt_id)
        self._deferred_total += 1
        self._aborted_since_metrics += self.responses_for(group.kind) - group.kept

    def is_open(self, group_id: str) -> bool:
        """False once a group completed or was deferred: late responses of it are dropped."""
        return group_id in self._groups

    def metrics(self) -> dict[str, float]:
        """`sched/round` (1 if the latest launch was a long group), `sched/aborted` (responses
        aborted since the last call: surplus of complete groups and unfinished ones of deferred
        groups), `sched/long_tail_queue`."""
        out = {
            "sched/round": self._last_kind,
            "sched/aborted": float(self._aborted_since_metrics),
            "sched/long_tail_queue": float(len(self.long_tail)),
        }
        self._aborted_since_metrics = 0
        return out
