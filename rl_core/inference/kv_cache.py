"""Slot-based KV cache for the reference engine.

Every running sequence owns one *slot*: a row of a preallocated
`[slots, capacity, kv_heads, head_dim]` tensor per layer (token-major, so the
new tokens of a step land with one `index_copy_` into a flat view). A forward pass covers
any subset of slots with a different query length and start position per
sequence; the model's attention layers call `update()`, which writes the new
keys/values at each sequence's own positions and hands back the keys/values of
exactly the slots in the batch. `batch_inputs` builds a forward's ids, positions
and 4-D attention mask from the same positions, so no sequence ever sees another's
tokens or a stale entry — which is what makes batched decoding give the same tokens as decoding
each sequence alone. Slots past the running ones hold finished sequences' K/V for requests that
continue them (`RetainedPrefixes`: a tool call's next turn).

The object duck-types the part of `transformers.Cache` the decoder layers use
(`update`), so it works with any HF causal LM whose attention goes through
`past_key_values.update(...)` (Llama, Qwen2, Mistral, ...).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

import torch

from rl_core.kernels.attention import masked_gqa_sdpa


class SlotKVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        initial_capacity: int = 256,
        max_capacity: int = 4096,
    ) -> None:
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = device
        self.max_capacity = max_capacity
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._grow(min(initial_capacity, max_capacity))
        # Set by `prepare()` for the forward pass about to run.
        self._slot_rows: torch.Tensor | slice = slice(0, 0)
        self._write_source: torch.Tensor = torch.empty(0, dtype=torch.long)
        self._write_rows: torch.Tensor = torch.empty(0, dtype=torch.long)
        self._kv_length = 0

    def _grow(self, capacity: int) -> None:
        # Growing copies the cache once per doubling; between steps only, so no
        # forward pass ever sees a half-copied cache.
        shape = (self.num_slots, capacity, self.num_kv_heads, self.head_dim)
        new_keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        new_values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        if self.capacity:
            for layer in range(self.num_layers):
                new_keys[layer][:, : self.capacity] = self.keys[layer]
                new_values[layer][:, : self.capacity] = self.values[layer]
        self.keys, self.values, self.capacity = new_keys, new_values, capacity

    def ensure_capacity(self, length: int) -> None:
        if length > self.max_capacity:
            raise ValueError(f"sequence length {length} exceeds the KV cache capacity {self.max_capacity}")
        if length > self.capacity:
            capacity = self.capacity
            while capacity < length:
                capacity *= 2
            self._grow(min(capacity, self.max_capacity))

    def prepare(
        self,
        slots: list[int],
        write_source: torch.Tensor,
        write_slots: torch.Tensor,
        write_positions: torch.Tensor,
        kv_length: int,
    ) -> None:
        """Describe the next forward pass.

        `slots[b]` is the slot of batch row b; `write_source` indexes the
        flattened `[batch * query_len]` new tokens that are real (not padding);
        `write_slots`/`write_positions` say where each of them goes; the layers
        get back keys/values `[batch, heads, kv_length, head_dim]`.
        """
        self.ensure_capacity(kv_length)
        first = slots[0]
        # A contiguous run of slots is a view (no gather copy); the engine hands
        # out the lowest free slot so a full batch usually is one.
        if slots == list(range(first, first + len(slots))):
            self._slot_rows = slice(first, first + len(slots))
        else:
            self._slot_rows = torch.tensor(slots, dtype=torch.long, device=self.device)
        self._write_source = write_source
        # Row of each new token in the flat `[slots * capacity, heads, head_dim]` view.
        self._write_rows = write_slots * self.capacity + write_positions
        self._kv_length = kv_length

    def batch_inputs(
        self, slots: list[int], starts: list[int], queries: list[list[int]], mask_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input ids, position ids, attention mask) of a forward that feeds `queries[b]` to slot
        `slots[b]` at positions `starts[b]` on, and `prepare` for it. Queries are left-padded to a
        common width, so the last columns hold every row's last tokens. The mask is boolean ("may
        attend", for sdpa) or, with `mask_dtype`, additive (0 / the dtype's minimum, for eager)."""
        batch = len(slots)
        query_lens = torch.tensor([len(query) for query in queries], device=self.device)
        width = int(query_lens.max())
        start = torch.tensor(starts, device=self.device)
        input_ids = torch.tensor([[0] * (width - len(query)) + query for query in queries], dtype=torch.long, device=self.device)
        columns = torch.arange(width, device=self.device).unsqueeze(0)
        pad = (width - query_lens).unsqueeze(1)
        real = columns >= pad
        # Padding columns sit at position 0 and may attend key 0 only: they stay
        # finite and are never written to the cache or read back.
        positions = torch.where(real, start.unsqueeze(1) + columns - pad, torch.zeros_like(columns))
        kv_length = int((start + query_lens).max())
        allowed = torch.arange(kv_length, device=self.device).view(1, 1, 1, kv_length) <= positions.unsqueeze(1).unsqueeze(-1)
        mask = allowed
        if mask_dtype is not None:
            mask = torch.zeros(allowed.shape, dtype=mask_dtype, device=self.device)
            mask.masked_fill_(~allowed, torch.finfo(mask_dtype).min)
        write_source = real.reshape(-1).nonzero().squeeze(-1)
        slot_ids = torch.tensor(slots, device=self.device)
        write_slots = slot_ids.unsqueeze(1).expand(batch, width).reshape(-1)[write_source]
        write_positions = positions.reshape(-1)[write_source]
        self.prepare(slots, write_source, write_slots, write_positions, kv_length)
        return input_ids, positions, mask

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, heads, query_len, head_dim = key_states.shape
        # [B, H, Q, D] -> [B*Q, H, D], keep the real tokens, copy them to their rows.
        new_keys = key_states.transpose(1, 2).reshape(batch * query_len, heads, head_dim)[self._write_source]
        new_values = value_states.transpose(1, 2).reshape(batch * query_len, heads, head_dim)[self._write_source]
        layer_keys, layer_values = self.keys[layer_idx], self.values[layer_idx]
        flat_shape = (self.num_slots * self.capacity, heads, head_dim)
        layer_keys.view(flat_shape).index_copy_(0, self._write_rows, new_keys.to(layer_keys.dtype))
        layer_values.view(flat_shape).index_copy_(0, self._write_rows, new_values.to(layer_values.dtype))
        # Views [B, H, kv_length, D] with strides over the token-major storage; no copy for a contiguous slot run.
        return (
            layer_keys[self._slot_rows, : self._kv_length].transpose(1, 2),
            layer_values[self._slot_rows, : self._kv_length].transpose(1, 2),
        )

    def copy_prefix(self, source_slot: int, target_slot: int, length: int) -> None:
        """Give `target_slot` the first `length` cached positions of `source_slot` (shared prompts)."""
        for layer in range(self.num_layers):
            self.keys[layer][target_slot, :length] = self.keys[layer][source_slot, :length]
            self.values[layer][target_slot, :length] = self.values[layer][source_slot, :length]

    def copy_positions(self, source_slots: Sequence[int], target_slots: Sequence[int], positions: Sequence[int]) -> None:
        """Copy the K/V at `positions[i]` of slot `source_slots[i]` to the same position of slot
        `target_slots[i]`, in every layer (decode steps shared by identical histories: shared_decode.py)."""
        position = torch.tensor(positions, dtype=torch.long, device=self.device)
        source = torch.tensor(source_slots, dtype=torch.long, device=self.device) * self.capacity + position
        target = torch.tensor(target_slots, dtype=torch.long, device=self.device) * self.capacity + position
        flat_shape = (self.num_slots * self.capacity, self.num_kv_heads, self.head_dim)
        for layer in range(self.num_layers):
            for tensors in (self.keys, self.values):
                flat = tensors[layer].view(flat_shape)
                flat.index_copy_(0, target, flat.index_select(0, source))

    # The decoder stack asks these only when it has to infer positions or a
    # mask itself; the engine always passes both, but answer sensibly anyway.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._kv_length

    @property
    def is_compileable(self) -> bool:
        return False

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


ENGINE_ATTENTION = "inflight_sdpa"


def register_engine_attention() -> None:
    """The engine's attention: the shared masked sdpa kernel (attention_kernels.py) under its own name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ENGINE_ATTENTION, masked_gqa_sdpa)


class _HasPrompt(Protocol):
    prompt_token_ids: list[int]
    prompt_kv_version: int


PromptHolder = TypeVar("PromptHolder", bound=_HasPrompt)


def _current_prompts(cached: Sequence[PromptHolder], version: int) -> dict[tuple[int, ...], PromptHolder]:
    """The cached sequences whose prompt K/V may be shared, by prompt: those computed at the
    current weight `version` (the rule `split_shared_prompts` explains)."""
    return {tuple(seq.prompt_token_ids): seq for seq in cached if seq.prompt_kv_version == version}


def split_shared_prompts(
    admitted: Sequence[PromptHolder], cached: Sequence[PromptHolder], version: int
) -> tuple[list[PromptHolder], list[tuple[PromptHolder, PromptHolder]]]:
    """Split newly admitted sequences into ones to prefill and (follower, source) pairs
    whose prompt is identical to a sequence already cached or prefilled this step — the
    n samples of one chat request, or a group of attempts at one problem: a follower
    copies its source's prompt KV instead of computing it again.

    Only a prompt whose K/V were computed at the current weight `version` is shared
    (`prompt_kv_version`; the admitted ones are about to be prefilled at `version`). A
    sequence running across a weight update keeps its stale KV and continues on the new
    weights — that is PipelineRL's in-flight update, and its tokens before the update carry
    the old version. But a request admitted after the update has all its tokens tagged with
    the new version, so copying old-weights prompt K/V into it would make it neither policy:
    it is prefilled afresh (and becomes the source for later requests of that prompt)."""
    sources = _current_prompts(cached, version)
    leaders: list[PromptHolder] = []
    followers: list[tuple[PromptHolder, PromptHolder]] = []
    for seq in admitted:
        key = tuple(seq.prompt_token_ids)
        source = sources.get(key)
        if source is not None and len(key) >= 2:
            followers.append((seq, source))
        else:
            leaders.append(seq)
            sources.setdefault(key, seq)
        seq.prompt_kv_version = version
    return leaders, followers


# A prompt prefix shorter than this is computed, not copied (a copy is one small tensor copy
# per layer, which only pays off over a few tokens).
MIN_SHARED_PREFIX = 8


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def split_shared_prefixes(
    leaders: Sequence[PromptHolder], cached: Sequence[PromptHolder], version: int
) -> tuple[list[PromptHolder], list[tuple[PromptHolder, PromptHolder, int]]]:
    """Split the sequences about to be prefilled into *pioneers*, prefilled whole, and
    (dependent, source, length) triples: a dependent's first `length` prompt tokens equal its
    source's, whose K/V at the current `version` are cached (a running sequence's) or about to
    be (a pioneer's), so it copies them and prefills only the rest. Prompts of one task share
    their system prompt and chat template: on the demo 23 of ~34 prompt tokens, and a held-out
    eval admits 64 such prompts at once. Same version rule as `split_shared_prompts`. A
    dependent always computes at least its last prompt token (its logits start the response)."""
    sources = _current_prompts(cached, version)
    pioneers: list[PromptHolder] = []
    dependents: list[tuple[PromptHolder, PromptHolder, int]] = []
    for seq in leaders:
        prompt = seq.prompt_token_ids
        best, best_length = None, 0
        for key, source in sources.items():
            length = min(_common_prefix(prompt, key), len(prompt) - 1)
            if length > best_length:
                best, best_length = source, length
        if best is not None and best_length >= MIN_SHARED_PREFIX:
            dependents.append((seq, best, best_length))
        else:
            pioneers.append(seq)
            sources.setdefault(tuple(prompt), seq)
    return pioneers, dependents


class _Finished(Protocol):
    """A sequence as `RetainedPrefixes.keep_finished` reads it (the engine's)."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    prompt_kv_version: int
    finish_reason: str | None
    slot: int
    cache_len: int


@dataclass
class RetainedPrefix:
    """The K/V a finished sequence left in a retention slot: `prompt_token_ids` are the tokens they
    cover (named so `split_shared_prefixes` reads them as a source's prefix), every one computed at
    weight version `prompt_kv_version`."""

    prompt_token_ids: list[int]
    prompt_kv_version: int
    slot: int


class RetainedPrefixes:
    """Finished sequences' K/V kept in slots of their own for requests that continue them.

    A tool call's next turn is a new request whose prompt is the finished turn's prompt + its tokens
    + the tool's output: with the turn's K/V kept, `split_shared_prefixes` copies all but the tool's
    output instead of prefilling the trajectory's history again (vLLM's prefix cache does the same).
    The same version rule holds as for running sources: only K/V computed at the current weights are
    handed out, so a sequence that ran across an update is not kept, and an update lets every kept
    one go. The least recently kept or used is overwritten first. The engine's loop thread alone
    calls these."""

    def __init__(self, slots: range) -> None:
        self._free = list(slots)
        self._held: OrderedDict[tuple[int, ...], RetainedPrefix] = OrderedDict()  # oldest first

    def keep_finished(self, cache: SlotKVCache, done: Sequence[_Finished], version: int) -> None:
        """Keep the K/V of sequences that finished in the step run at `version` (ended, not aborted
        or failed), where every one was computed at it: admitted at it, the weights cannot have
        changed since."""
        with torch.inference_mode():  # the cache's tensors were made inside the step's inference mode
            for seq in done:
                if seq.finish_reason in ("stop", "length") and seq.prompt_kv_version == version:
                    self._keep(cache, seq.slot, (seq.prompt_token_ids + seq.token_ids)[: seq.cache_len], version)

    def _keep(self, cache: SlotKVCache, source_slot: int, tokens: Sequence[int], version: int) -> None:
        """Copy the first `len(tokens)` cached positions of `source_slot` (whose K/V are `tokens`'s,
        computed at `version`) into a retention slot."""
        key = tuple(tokens)
        if len(key) < MIN_SHARED_PREFIX or not (self._free or self._held):
            return
        if key in self._held:  # the same history twice (a group's identical short answers)
            self._held.move_to_end(key)
            return
        slot = self._free.pop() if self._free else self._held.popitem(last=False)[1].slot
        cache.copy_prefix(source_slot, slot, len(key))
        self._held[key] = RetainedPrefix(list(key), version, slot)

    def current(self, version: int) -> list[RetainedPrefix]:
        """The kept K/V computed at `version`; older ones are let go (their slots reused)."""
        for key in [key for key, kept in self._held.items() if kept.prompt_kv_version != version]:
            self._free.append(self._held.pop(key).slot)
        return list(self._held.values())

    def used(self, kept: RetainedPrefix) -> None:
        """`kept` was just copied from: last to be overwritten."""
        key = tuple(kept.prompt_token_ids)
        if key in self._held:
            self._held.move_to_end(key)

    def __len__(self) -> int:
        return len(self._held)


# --- which slot each running sequence holds ------------------------------------------


class _HoldsSlot(Protocol):
    slot: int
    cache_len: int


def compact_slots(running: Sequence[_HoldsSlot], free_slots: list[int], cache: SlotKVCache) -> None:
    """Move the sequences of the highest slots into the holes finished ones left below n
    (n = running sequences), so the running ones hold slots 0..n-1 again. A move copies one
    sequence's cached K/V once; without it a fragmented batch gathers every running
    sequence's K/V for every layer on every step (a sixth of a decode step at batch 256).
    The engine calls it on its own thread between steps, holding its lock, so no forward
    pass sees a half-moved slot."""
    count = len(running)
    holes = sorted(slot for slot in free_slots if slot < count)
    if not holes:
        return
    movers = sorted((seq for seq in running if seq.slot >= count), key=lambda seq: seq.slot)
    with torch.inference_mode():  # the cache's tensors were made inside the step's inference mode
        for hole, seq in zip(holes, movers):
            cache.copy_prefix(seq.slot, hole, seq.cache_len)
            free_slots.remove(hole)
            free_slots.append(seq.slot)
            seq.slot = hole


def followers_first(leaders: Sequence[_HoldsSlot], followers: Sequence[_HoldsSlot]) -> None:
    """Hand a step's newly admitted slots (nothing cached in them yet) to the followers of
    shared prompts first: they decode right after the running sequences, so the decode batch
    stays one slot range (a view of the cache, not a gather); the leaders prefill after."""
    slots = sorted(seq.slot for seq in [*followers, *leaders])
    for seq, slot in zip([*sorted(followers, key=lambda seq: seq.slot), *leaders], slots):
        seq.slot = slot
