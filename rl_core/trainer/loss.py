"""The learning signal's data path: group-relative advantages, token packing, log-probabilities.

Data flows through this file in order:

1. (`advantages.group_advantages`, in the actor: rewards → advantages relative to the group.)
2. `pack_micro_batches` — the trainer packs an optimizer batch of samples into
   micro-batches of at most `micro_batch_tokens` tokens: a group's completions share one
   copy of their prompt and of the tokens they begin with alike (a trie; a 4-D mask lets
   each token attend its ancestors and itself only), units fill rows of at most
   `row_tokens`, rows are stacked as a batch.
3. `token_logprobs_from_logits` — log p(token | its context) and the entropy of the
   distribution that sampled it, for each token a sample scored. The logits are
   divided by the sampling temperature first: behaviour logprobs come from the
   temperature-scaled distribution the engine drew from, so the trainer must score the
   same distribution or the importance ratio is not 1 even without a policy change.
4. (`losses.policy_loss`: the objective chosen by `trainer.loss`, scored on these terms.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from rl_core.envs.advantages import carries_gradient
from rl_core.config.run_config import DEFAULT_ROW_TOKENS
from rl_core.common.contracts import RolloutSample
from rl_core.kernels.packed_attention import PackedLayout
from rl_core.trainer.token_trie import TokenTrie


# --- 2. packing --------------------------------------------------------------------

# Rows are capped at `trainer.row_tokens`. Attention under a row's dense mask ([T, T]) costs the
# square of the row (one 4096-token row took 5.3 s per demo step on one core, bench/RESULTS.md),
# so attended by the mask rows would stay short (DEFAULT_ROW_TOKENS) and the rows of a micro-batch
# be stacked as a batch. Every trainer backend attends by `MicroBatch.packed_layout` instead
# (packed_attention.py: exact, whatever attention the model's config.json names), pays only for
# what each token may see and packs a micro-batch as one row (config.LAYOUT_ROW_TOKENS).


@dataclass
class MicroBatch:
    """Packed rows stacked as a batch. Two kinds of [R, ...] tensors:

    - *nodes* ([R, T], R rows padded to T tokens): what the model computes. A row holds prompt
      units, each a trie (token_trie.py) in depth-first order: one copy of a group's prompt,
      then its completions, sharing the tokens they begin with alike. `position_ids` are each
      token's depth, so every token sees exactly what it saw when it was sampled;
      `attention_mask` ([R, 1, T, T], True where a query may attend a key) lets a token see
      its ancestors and itself only.
    - *terms* ([R, K]): what the loss scores, one per (sample, completion token), laid out
      sample by sample in `sample_order`: `target_ids` is the token, `logit_source` the node
      (column of the same row) whose logits predict it, and `behaviour_logprobs`,
      `advantages`, `token_versions` that sample's values. A shared node is computed once
      and scored by every sample through it. `term_mask` marks the real terms; `loss_mask`
      those trained: the real terms of the policy's own tokens (a multi-turn sample's tool
      output, `RolloutSample.completion_mask` 0, is context only: scored, never trained)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_ids: torch.Tensor
    logit_source: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_versions: torch.Tensor
    # [R, K]: the index (into the packed samples) of the sample each term belongs to, -1 on
    # padding: a sequence-level objective (GSPO) sums a sample's terms, which always lie in one row.
    term_sequence: torch.Tensor
    num_sequences: int
    # Index (into the packed samples) of each completion, in the order their terms lie in
    # `loss_mask` read row by row: maps trained tokens back to samples (train_records.py).
    sample_order: list[int] = field(default_factory=list)
    # The same structure as branches of nodes: lets a backend attend only where the mask allows
    # instead of over whole rows (packed_attention.py).
    packed_layout: PackedLayout | None = None
    # [R, K]: every real term, trained or not (`loss_mask` without the tool tokens left out): what
    # the trained-logprob records read, one value per completion token. None: equal to loss_mask.
    term_mask: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Token slots computed, padding included."""
        return int(self.input_ids.numel())


def _validate_sample(sample: RolloutSample) -> None:
    n = len(sample.completion_token_ids)
    if n == 0:
        raise ValueError(f"sample {sample.sample_id}: empty completion")
    if len(sample.behaviour_logprobs) != n or len(sample.token_versions) != n:
        raise ValueError(
            f"sample {sample.sample_id}: completion_token_ids ({n}), behaviour_logprobs "
            f"({len(sample.behaviour_logprobs)}) and token_versions ({len(sample.token_versions)}) differ in length"
        )
    if not sample.prompt_token_ids:
        raise ValueError(f"sample {sample.sample_id}: empty prompt")
    if sample.completion_mask is not None and len(sample.completion_mask) != n:
        raise ValueError(f"sample {sample.sample_id}: completion_mask ({len(sample.completion_mask)}) and "
                         f"completion_token_ids ({n}) differ in length")


@dataclass
class _Unit:
    """Samples packed under one copy of their prompt, and the trie of their tokens."""

    members: list[int]  # indices into the packed samples
    trie: TokenTrie


def _prompt_units(samples: Sequence[RolloutSample], row_tokens: int, share_prompts: bool, share_prefixes: bool) -> list[_Unit]:
    """Samples grouped by identical prompt (in first-seen order), each unit cut so that its
    trie fits `row_tokens` where possible (a unit is never empty)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for index, sample in enumerate(samples):
        key = tuple(sample.prompt_token_ids) if share_prompts else (-1, index)
        by_prompt.setdefault(key, []).append(index)
    units: list[_Unit] = []
    for members in by_prompt.values():
        prompt = samples[members[0]].prompt_token_ids
        unit = _Unit([], TokenTrie(prompt, share_prefixes))
        for index in members:
            completion = samples[index].completion_token_ids
            if unit.members and len(unit.trie) + unit.trie.new_nodes(completion) > row_tokens:
                units.append(unit)
                unit = _Unit([], TokenTrie(prompt, share_prefixes))
            unit.trie.add(completion)
            unit.members.append(index)
        units.append(unit)
    return units


def _first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices into `sizes` packed into bins of at most `capacity` (an item larger than
    that gets a bin of its own: nothing is ever truncated)."""
    bins: list[list[int]] = []
    used: list[int] = []
    for index in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):
        for b, total in enumerate(used):
            if total + sizes[index] <= capacity:
                bins[b].append(index)
                used[b] += sizes[index]
                break
        else:
            bins.append([index])
            used.append(sizes[index])
    return bins


def _rows_with_least_padding(unit_sizes: Sequence[int], row_tokens: int) -> list[list[int]]:
    """Units packed into rows, trying every row capacity from the largest unit up to
    `row_tokens` in steps of it: rows are padded to the longest, so a capacity that leaves
    one row with two units and the rest with one pads every row to the long one. The
    capacity with the fewest padded tokens wins (the smaller on a tie: cheaper attention)."""
    largest = max(unit_sizes)
    best: list[list[int]] | None = None
    best_cost = 0
    capacity = largest
    while True:
        rows = _first_fit_decreasing(unit_sizes, capacity)
        cost = len(rows) * max(sum(unit_sizes[i] for i in row) for row in rows)
        if best is None or cost < best_cost:
            best, best_cost = rows, cost
        if capacity >= row_tokens:
            return best
        capacity = min(row_tokens, capacity + largest)


def pack_micro_batches(
    samples: Sequence[RolloutSample],
    micro_batch_tokens: int,
    row_tokens: int = DEFAULT_ROW_TOKENS,
    share_prompts: bool = True,
    share_prefixes: bool = True,
) -> list[MicroBatch]:
    """Pack an optimizer batch: prompt units into rows of at most `row_tokens` (first fit
    decreasing), rows into micro-batches whose padded size (rows x longest row) is at most
    `micro_batch_tokens`. Nothing is truncated: dropping tokens would change the gradient.
    `share_prefixes=False` lays each completion out whole under its prompt; `share_prompts=False`
    gives every sample its own prompt copy too (the layouts tests compare against)."""
    for sample in samples:
        _validate_sample(sample)
    row_tokens = min(row_tokens, micro_batch_tokens)  # a row is never larger than a micro-batch
    units = _prompt_units(samples, row_tokens, share_prompts, share_prefixes)
    unit_sizes = [len(unit.trie) for unit in units]
    row_members = _rows_with_least_padding(unit_sizes, row_tokens)
    rows = [[units[i] for i in members] for members in row_members]
    row_sizes = [sum(unit_sizes[i] for i in members) for members in row_members]
    batches: list[list[int]] = []  # row indices; rows longest first, so a batch's first row sets its width
    for index in sorted(range(len(rows)), key=lambda i: row_sizes[i], reverse=True):
        if batches and (len(batches[-1]) + 1) * row_sizes[batches[-1][0]] <= micro_batch_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return [_stack_rows([rows[i] for i in batch], samples) for batch in batches]


def _stack_rows(rows: list[list[_Unit]], samples: Sequence[RolloutSample]) -> MicroBatch:
    nodes: dict[str, list[list[int]]] = {"ids": [], "pos": [], "end": []}
    terms: dict[str, list[list[Any]]] = {"target": [], "source": [], "behaviour": [], "adv": [], "ver": [], "seq": [], "train": []}
    branches: list[tuple[int, list[int], list[int]]] = []  # (row, own columns, ancestor columns)
    for row_number, row in enumerate(rows):
        ids: list[int] = []
        pos: list[int] = []
        end: list[int] = []
        target: list[int] = []
        source: list[int] = []
        behaviour: list[float] = []
        adv: list[float] = []
        ver: list[int] = []
        seq: list[int] = []
        train: list[bool] = []
        for unit in row:
            layout = unit.trie.layout()
            start = len(ids)
            ids += layout.token_ids
            pos += layout.position_ids
            end += [start + e for e in layout.subtree_end]
            branches += [(row_number, [start + p for p in own], [start + p for p in context]) for own, context in layout.branches]
            for sample_index, path in zip(unit.members, layout.paths):
                sample = samples[sample_index]
                # Token k is scored by the logits of the node before it: the prompt's last for k = 0.
                source += [start + layout.prompt_last] + [start + p for p in path[:-1]]
                target += sample.completion_token_ids
                behaviour += [float(x) for x in sample.behaviour_logprobs]
                adv += [float(sample.advantage)] * len(path)
                ver += [int(v) for v in sample.token_versions]
                seq += [sample_index] * len(path)
                train += [bool(m) for m in sample.trained_mask()]
        for name, values in zip(nodes, (ids, pos, end)):
            nodes[name].append(values)
        for name, values in zip(terms, (target, source, behaviour, adv, ver, seq, train)):
            terms[name].append(values)
    width = max(len(values) for values in nodes["ids"])
    term_width = max(len(values) for values in terms["target"])

    def padded(columns: list[list[Any]], length: int, fill: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([values + [fill] * (length - len(values)) for values in columns], dtype=dtype)

    # Key j is visible to query i when i lies in j's subtree: j <= i < end[j] (pre-order). A
    # padding token's subtree is itself, so it attends only itself (a query with nothing to
    # attend would give NaN) and no real token attends it.
    column = torch.arange(width)
    node_valid = column.unsqueeze(0) < torch.tensor([len(values) for values in nodes["ids"]]).unsqueeze(1)
    end = torch.where(node_valid, padded(nodes["end"], width, 0, torch.long), column + 1)
    real = torch.arange(term_width).unsqueeze(0) < torch.tensor([len(values) for values in terms["target"]]).unsqueeze(1)
    allowed = (column.view(1, 1, width) <= column.view(1, width, 1)) & (column.view(1, width, 1) < end.unsqueeze(1))
    return MicroBatch(
        input_ids=padded(nodes["ids"], width, 0, torch.long),
        position_ids=padded(nodes["pos"], width, 0, torch.long),
        attention_mask=allowed.unsqueeze(1),
        target_ids=padded(terms["target"], term_width, 0, torch.long),
        logit_source=padded(terms["source"], term_width, 0, torch.long),
        loss_mask=real & padded(terms["train"], term_width, False, torch.bool),
        term_mask=real,
        behaviour_logprobs=padded(terms["behaviour"], term_width, 0.0, torch.float32),
        advantages=padded(terms["adv"], term_width, 0.0, torch.float32),
        token_versions=padded(terms["ver"], term_width, 0, torch.long),
        term_sequence=padded(terms["seq"], term_width, -1, torch.long),
        num_sequences=sum(len(unit.members) for row in rows for unit in row),
        sample_order=[index for row in rows for unit in row for index in unit.members],
        packed_layout=PackedLayout.from_branches(
            [([row * width + c for c in own], [row * width + c for c in context]) for row, own, context in branches]),
    )


def samples_with_gradient(samples: Sequence[RolloutSample], kl_coef: float) -> list[RolloutSample]:
    """The samples the trainer computes (`advantages.carries_gradient`): an all-equal group kept
    in the step, as TRL keeps it, has a zero gradient without a KL term, so computing it is wasted
    work. The caller still divides by the whole batch's sequence count, so the step's gradient is
    exactly what training on all of them gives. One sample is kept if none has a gradient: every
    rank must run a forward (ZeRO-3 gathers are collective) and an optimizer step with no
    backward at all is a special case not worth having."""
    informative = [sample for sample in samples if carries_gradient(sample.advantage, kl_coef)]
    return informative or list(samples[:1])


# --- 3. log-probabilities ----------------------------------------------------------


def model_token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    device: torch.device | str,
    temperature: float = 1.0,
    logit_source: torch.Tensor | None = None,
    packed_layout: PackedLayout | None = None,
    target_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run an HF causal LM (or a DeepSpeed engine wrapping one) without a KV cache and return
    log p(token | its context) and entropies under the distribution sampled at `temperature`:
    [B, T] aligned with input_ids, or for a packed batch (`MicroBatch`: its 4-D mask, its
    `packed_layout` for a model attending through `packed_attention`) [B, K] for its terms,
    `target_ids` scored at `logit_source` (`token_logprobs_from_logits`). Every trainer backend
    and the reference model go through here, so the alignment is defined once."""
    input_ids = input_ids.to(device)
    extra = {} if packed_layout is None else {"packed_layout": packed_layout.to(device)}
    output = model(
        input_ids=input_ids,
        attention_mask=None if attention_mask is None else attention_mask.to(device),
        position_ids=None if position_ids is None else position_ids.to(device),
        use_cache=False,
        **extra,
    )
    return token_logprobs_from_logits(
        output.logits, input_ids, temperature, None if logit_source is None else logit_source.to(device),
        None if target_ids is None else target_ids.to(device),
    )


@torch.no_grad()
def reference_token_logprobs(
    reference: torch.nn.Module | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    device: torch.device | str,
    temperature: float = 1.0,
    logit_source: torch.Tensor | None = None,
    packed_layout: PackedLayout | None = None,
    target_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """`model_token_logprobs` of a backend's frozen reference model (the k3 KL penalty), for
    every backend; a backend built without one (trainer.kl_coef 0) refuses."""
    if reference is None:
        raise RuntimeError("reference_logprobs: the backend was built without a reference model (trainer.kl_coef is 0)")
    return model_token_logprobs(
        reference, input_ids, attention_mask, position_ids, device, temperature, logit_source, packed_layout, target_ids)[0]


def scoring_temperature(sampling_temperature: float) -> float:
    """The temperature the trainer divides logits by for samples drawn at
    `sampling_temperature`. Greedy requests (0) report the plain log-softmax of the argmax
    (`engine_sampling.sample_rows`), so they are scored at 1."""
    return sampling_temperature if sampling_temperature > 0.0 else 1.0


def token_logprobs_from_logits(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0, logit_source: torch.Tensor | None = None,
    target_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log p(token | context) and the entropy of that distribution, where p is
    softmax(logits / temperature): the distribution the engine sampled from.

    Without `target_ids` both outputs are [B, T] and aligned with `input_ids`: token t is
    predicted by the logits at `logit_source[:, t]`, by default t - 1 (position 0 has no
    prediction and gets 0: it is always a prompt token, never trained). With `target_ids`
    ([B, K], a packed micro-batch's terms) term k scores `target_ids[:, k]` under the logits
    at column `logit_source[:, k]` of the same row, and both outputs are [B, K]. The entropy
    is a metric only and is computed without gradient."""
    if temperature <= 0.0:
        raise ValueError(f"token_logprobs_from_logits: temperature must be > 0, got {temperature}")
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    batch, length, vocab = log_probs.shape
    aligned = target_ids is None
    if target_ids is None:
        target_ids = input_ids
    elif logit_source is None:
        raise ValueError("token_logprobs_from_logits: target_ids needs the logit_source of each target")
    if logit_source is None:
        previous = torch.arange(length, device=log_probs.device) - 1
        logit_source = previous.clamp(min=0).unsqueeze(0).expand(batch, length)
    # One gather on the flattened [B*T, V] table: no [B, T, V] copy of the log-probabilities.
    rows = (logit_source + torch.arange(batch, device=log_probs.device).unsqueeze(1) * length).reshape(-1)
    flat = log_probs.reshape(batch * length, vocab)
    token_logp = flat[rows, target_ids.reshape(-1)].view(target_ids.shape)
    with torch.no_grad():
        entropy_at = -(log_probs.exp() * log_probs).sum(-1)
        entropy = entropy_at.reshape(-1)[rows].view(target_ids.shape)
    if not aligned:
        return token_logp, entropy
    first = torch.zeros_like(token_logp, dtype=torch.bool)
    first[:, 0] = True
    return token_logp.masked_fill(first, 0.0), entropy.masked_fill(first, 0.0)
