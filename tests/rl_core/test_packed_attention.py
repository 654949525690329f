"""Packed attention: the trainer's forward over packed rows attends only where the row's mask
allows, and gives what the dense-mask forward gives."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from rl_core.common.contracts import RolloutSample
from rl_core.trainer.loss import pack_micro_batches
from rl_core.trainer.torch_backend import TorchBackend


def samples_with_shared_prompts(seed: int) -> list[RolloutSample]:
    rng = random.Random(seed)
    samples = []
    for group in range(6):
        prompt = [rng.randrange(10, 200) for _ in range(rng.randrange(3, 12))]
        first = [rng.randrange(10, 200) for _ in range(rng.randrange(1, 4))]
        for member in range(rng.choice([1, 4, 5])):  # a lone sample is a unit of its own
            # Members often begin alike (a shared start, then their own tokens), as at T=1.
            start = first[: rng.randrange(0, len(first) + 1)]
            completion = start + [rng.randrange(10, 200) for _ in range(rng.randrange(1 if not start else 0, 12))]
            samples.append(RolloutSample(
                sample_id=f"s{group}-{member}", group_id=f"g{group}", prompt_id=f"p{group}", prompt_token_ids=prompt,
                completion_token_ids=completion, behaviour_logprobs=[-3.0] * len(completion),
                token_versions=[0] * len(completion), reward=float(member % 2), success=bool(member % 2),
                advantage=1.0 if member % 2 else -1.0,
            ))
    return samples


def test_packed_attention_matches_the_dense_mask_forward_and_backward(untrained_tiny_model: Path) -> None:
    # Small rows: several rows per micro-batch, rows padded to the longest, units of 1-4 samples.
    batches = pack_micro_batches(samples_with_shared_prompts(3), micro_batch_tokens=120, row_tokens=40)
    assert len(batches) >= 2 and any(batch.input_ids.shape[0] > 1 for batch in batches)
    results = []
    for use_layout in (False, True):
        backend = TorchBackend(untrained_tiny_model)
        logprobs = []
        for batch in batches:
            layout = batch.packed_layout if use_layout else None
            logp, entropy = backend.token_logprobs(
                batch.input_ids, batch.attention_mask, batch.position_ids, 1.0, batch.logit_source, layout, batch.target_ids)
            (logp * batch.loss_mask).sum().backward()
            logprobs.append(logp[batch.loss_mask])
        grads = torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None])
        results.append((torch.cat(logprobs).detach(), grads))
    (dense_logp, dense_grad), (packed_logp, packed_grad) = results
    assert torch.allclose(dense_logp, packed_logp, atol=1e-5)
    assert torch.allclose(dense_grad, packed_grad, atol=1e-5, rtol=1e-4)


def test_the_layout_lists_every_token_once_in_one_branch() -> None:
    samples = samples_with_shared_prompts(4)
    batch = pack_micro_batches(samples, micro_batch_tokens=4096, row_tokens=64)[0]
    layout = batch.packed_layout
    positions = layout.branch_index[layout.branch_valid]
    assert positions.unique().numel() == positions.numel()
    # Every real token is in exactly one branch; padding in none.
    real = (batch.input_ids.flatten() != 0).nonzero().squeeze(-1)
    assert torch.equal(positions.sort().values, real)
    # A branch's context is exactly its first token's ancestors under the dense mask.
    mask = batch.attention_mask[:, 0].reshape(-1, batch.input_ids.shape[1])
    width = batch.input_ids.shape[1]
    for own, own_valid, context, context_valid in zip(layout.branch_index, layout.branch_valid, layout.context_index, layout.context_valid):
        first = int(own[0])
        row, column = divmod(first, width)
        ancestors = (mask[row * width + column].nonzero().squeeze(-1) + row * width).tolist()
        assert sorted(context[context_valid].tolist() + [first]) == ancestors
    assert batch.num_sequences == len(samples)
    # Completions that begin alike were laid out once.
    (plain,) = pack_micro_batches(samples, micro_batch_tokens=4096, row_tokens=64, share_prefixes=False)
    assert len(real) < int((plain.input_ids != 0).sum())
