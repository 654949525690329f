"""A prompt unit's tokens as a trie: what the trainer computes once for a whole group.

A group's samples share their prompt, and at T=1 on a small or confident policy they also
share the first tokens of their answers (on the demo, 71% of the completion tokens of a step
repeat a token that another member of the group sampled after the same history). The hidden
state of a token depends only on the tokens before it, so a trie of the unit holds every
distinct (history, token) once: the prompt is a chain from the root, each completion a path
under the prompt's last token, and completions that begin alike share their common start.

`TokenTrie.layout()` lays the trie out in depth-first (pre-)order, the order a packed row
holds it in. Pre-order makes each node's subtree one contiguous run `[i, end[i])`, so "key j
is visible to query i" is just `j <= i < end[j]` (the 4-D mask of loss.py), and a chain of
only-children is a contiguous *branch*: packed_attention.py attends branch by branch, each
over the keys of its ancestors then causally over its own. With sharing off every completion
is a path of its own and the layout is the plain one (prompt once, then each completion).

The loss is not shared: each sample still scores each of its tokens with its own advantage,
behaviour logprob and version, read from the logits of the node before it (`paths`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class TrieLayout:
    """A unit in pre-order; positions are offsets from the unit's first token."""

    token_ids: list[int]
    position_ids: list[int]  # depth: what each token's position was when it was sampled
    subtree_end: list[int]  # node i's subtree is [i, subtree_end[i])
    branches: list[tuple[list[int], list[int]]]  # (own positions, ancestor positions) of each branch
    paths: list[list[int]]  # per completion (in insertion order): the position of each of its tokens
    prompt_last: int  # the position whose logits predict every completion's first token


class TokenTrie:
    """One prompt and the completions added under it."""

    def __init__(self, prompt: Sequence[int], share_prefixes: bool) -> None:
        if not prompt:
            raise ValueError("TokenTrie: empty prompt")
        self.share_prefixes = share_prefixes
        self.tokens: list[int] = list(prompt)
        self.parent: list[int] = [-1] + list(range(len(prompt) - 1))
        self.children: list[list[int]] = [[index + 1] for index in range(len(prompt) - 1)] + [[]]
        self._child_by_token: dict[tuple[int, int], int] = {}
        self._paths: list[list[int]] = []
        self._prompt_last = len(prompt) - 1  # the prompt is nodes 0..P-1; completion nodes follow

    def __len__(self) -> int:
        return len(self.tokens)

    def new_nodes(self, completion: Sequence[int]) -> int:
        """How many nodes `add(completion)` would create."""
        if not self.share_prefixes:
            return len(completion)
        node = self._prompt_last
        for depth, token in enumerate(completion):
            child = self._child_by_token.get((node, token))
            if child is None:
                return len(completion) - depth
            node = child
        return 0

    def add(self, completion: Sequence[int]) -> None:
        """A completion under the prompt's last token, through the nodes it shares (if sharing)."""
        node = self._prompt_last
        path = []
        for token in completion:
            child = self._child_by_token.get((node, token)) if self.share_prefixes else None
            if child is None:
                child = len(self.tokens)
                self.tokens.append(token)
                self.parent.append(node)
                self.children.append([])
                self.children[node].append(child)
                if self.share_prefixes:
                    self._child_by_token[(node, token)] = child
            path.append(child)
            node = child
        self._paths.append(path)

    def layout(self) -> TrieLayout:
        """The trie in pre-order (children in the order they were added), with what the packed
        row, its mask, packed attention and the loss terms need."""
        order: list[int] = []
        stack = [0]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(self.children[node]))
        position = {node: index for index, node in enumerate(order)}
        size = [1] * len(order)
        for node in reversed(order):
            if self.parent[node] >= 0:
                size[self.parent[node]] += size[node]
        depth = [0] * len(order)
        for node in order[1:]:
            depth[node] = depth[self.parent[node]] + 1
        branches: list[tuple[list[int], list[int]]] = []
        for node in order:
            parent = self.parent[node]
            if parent >= 0 and len(self.children[parent]) == 1:
                continue  # an only child continues its parent's branch
            own = [position[node]]
            while len(self.children[order[own[-1]]]) == 1:
                own.append(own[-1] + 1)  # pre-order puts an only child right after its parent
            ancestors = []
            while parent >= 0:
                ancestors.append(position[parent])
                parent = self.parent[parent]
            branches.append((own, ancestors[::-1]))
        return TrieLayout(
            token_ids=[self.tokens[node] for node in order],
            position_ids=[depth[node] for node in order],
            subtree_end=[position[node] + size[node] for node in order],
            branches=branches,
            paths=[[position[node] for node in path] for path in self._paths],
            prompt_last=position[self._prompt_last],
        )
