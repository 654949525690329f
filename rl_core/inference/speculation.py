"""HistoSpec (RhymeRL): speculative decoding drafted from a prompt's own previous responses.

In RL the same prompt is sampled again every epoch, and a policy that moved only a little
answers much as it did last time. So instead of a draft model, the draft comes from an index
over the prompt's earlier responses: match the longest suffix of what has been generated so
far (context lengths `max_match` down to `min_match` tokens) and follow the most frequent
continuation while the path's empirical probability (product of child count / parent count)
stays above `min_path_prob`. The engine verifies drafts losslessly (`sampling.verify_draft`),
so a bad draft costs speed, never correctness.

The index is an n-gram → next-token count table per history key. Every response is indexed
from a virtual start (`_START` padding), so the very first tokens of a response can be
drafted too: short math answers are where most of their tokens are. Memory is bounded:
each key keeps its last `history_responses` responses (about an epoch's group) and at most
`max_history_keys` keys are kept, least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from rl_core.config.run_config import HistoSpecConfig

# Real token ids are >= 0; -1 pads the left of every sequence so that "the start of a response"
# is itself a context that can be matched.
_START = -1


@dataclass
class _KeyHistory:
    """One prompt's responses and the n-gram counts over them."""

    responses: deque[list[int]] = field(default_factory=deque)
    # context tuple -> [total count, {next token: count}]
    counts: dict[tuple[int, ...], list] = field(default_factory=dict)


class HistoryDrafter:
    """The drafter the engine calls: `draft(...)` while decoding, `add_response(...)` when a
    sequence with a history key finishes. Not thread-safe by itself: the engine calls it
    from its one decode loop."""

    def __init__(self, config: HistoSpecConfig) -> None:
        if config.min_match > config.max_match:
            raise ValueError(
                f"histospec.min_match ({config.min_match}) must be <= histospec.max_match ({config.max_match})"
            )
        self.config = config
        self.min_match = config.min_match
        self.max_match = config.max_match
        self.min_path_prob = config.min_path_prob
        self.history_responses = config.history_responses
        self.max_history_keys = config.max_history_keys
        self._keys: OrderedDict[str, _KeyHistory] = OrderedDict()

    # -- writing the history ---------------------------------------------------------------

    def add_response(self, history_key: str, token_ids: list[int]) -> None:
        """Index a finished response of `history_key`; the oldest response beyond
        `history_responses` (and the least recently used key beyond `max_history_keys`) is forgotten."""
        if not history_key:
            return
        tokens = [int(token) for token in token_ids]
        if any(token < 0 for token in tokens):
            raise ValueError(f"token ids must be >= 0 (history key {history_key!r})")
        history = self._keys.get(history_key)
        if history is None:
            history = self._keys[history_key] = _KeyHistory()
        self._keys.move_to_end(history_key)
        history.responses.append(tokens)
        self._count(history, tokens, +1)
        while len(history.responses) > self.history_responses:
            self._count(history, history.responses.popleft(), -1)
        while len(self._keys) > self.max_history_keys:
            self._keys.popitem(last=False)

    def _count(self, history: _KeyHistory, tokens: list[int], sign: int) -> None:
        padded = [_START] * self.max_match + tokens
        counts = history.counts
        for position in range(self.max_match, len(padded)):
            next_token = padded[position]
            for length in range(self.min_match, self.max_match + 1):
                context = tuple(padded[position - length : position])
                entry = counts.get(context)
                if entry is None:
                    entry = counts[context] = [0, {}]
                entry[0] += sign
                children = entry[1]
                children[next_token] = children.get(next_token, 0) + sign
                if children[next_token] == 0:
                    del children[next_token]
                if entry[0] == 0:
                    del counts[context]

    def forget(self, history_key: str) -> None:
        self._keys.pop(history_key, None)

    def num_responses(self, history_key: str) -> int:
        history = self._keys.get(history_key)
        return len(history.responses) if history else 0

    def __contains__(self, history_key: str) -> bool:
        return history_key in self._keys

    # -- drafting ----------------------------------------------------------------------------

    def lookup(self, history_key: str, tokens: list[int]) -> tuple[int, dict[int, int], int] | None:
        """Longest context (max_match … min_match) ending `tokens` seen in the history:
        (match length, next-token counts, total count), or None."""
        history = self._keys.get(history_key)
        if history is None:
            return None
        tail = tokens[-self.max_match :]
        if len(tail) < self.max_match:
            tail = [_START] * (self.max_match - len(tail)) + list(tail)
        counts = history.counts
        for length in range(self.max_match, self.min_match - 1, -1):
            entry = counts.get(tuple(tail[self.max_match - length :]))
            if entry is not None:
                return length, entry[1], entry[0]
        return None

    def draft(self, history_key: str, generated_token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` drafted next tokens after `generated_token_ids` (the response so far,
        without the prompt); empty when nothing in the history matches."""
        if max_tokens <= 0 or history_key not in self._keys:
            return []
        context = list(generated_token_ids[-self.max_match :])
        drafted: list[int] = []
        path_prob = 1.0
        while len(drafted) < max_tokens:
            match = self.lookup(history_key, context)
            if match is None:
                break
            _, children, total = match
            # Most frequent continuation; ties go to the one seen first (dict order).
            best_token, best_count = max(children.items(), key=lambda item: item[1])
            path_prob *= best_count / total
            if path_prob < self.min_path_prob:
                break
            drafted.append(best_token)
            context.append(best_token)
            if len(context) > self.max_match:
                del context[0]
        return drafted


class DraftLengthController:
    """Adaptive draft length of one sequence, as the reference engine runs it: start at
    `initial_draft_len`, double on a fully accepted draft (up to `max_draft_len`), halve
    otherwise (down to 1). The engine keeps one per sequence and asks the drafter for at
    most `length` tokens (less where the step's budget or the room left is smaller)."""

    def __init__(self, initial_draft_len: int, max_draft_len: int) -> None:
        self.maximum = max(int(max_draft_len), 1)
        self.length = min(max(int(initial_draft_len), 1), self.maximum)

    @classmethod
    def from_config(cls, config: HistoSpecConfig) -> DraftLengthController:
        return cls(config.initial_draft_len, config.max_draft_len)

    def update(self, drafted: int, accepted: int) -> int:
        """Feed one verify step's outcome; returns the next draft length. A step with an empty
        draft (nothing matched) leaves the length unchanged."""
        if drafted > 0:
            if accepted >= drafted:
                self.length = min(self.length * 2, self.maximum)
            else:
                self.length = max(self.length // 2, 1)
        return self.length


def make_drafter(config: HistoSpecConfig) -> HistoryDrafter | None:
    """The drafter for an engine, or None when HistoSpec is off."""
    return HistoryDrafter(config) if config.enabled else None
