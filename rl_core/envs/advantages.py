"""Group-relative advantages (GRPO-style, no value model): the actor scores a group of
attempts at one prompt and writes each sample's advantage into the stream; the trainer's
loss (`trainer/loss.py`) only reads it. Pure Python, so the actor needs neither torch nor the loss.
"""

from __future__ import annotations

import math
from typing import Sequence


def carries_gradient(advantage: float, kl_coef: float) -> bool:
    """Whether a sample's loss terms can move the weights. Without a KL penalty every term of
    every policy objective (losses.policy_loss; gspo's sequence term too) is a multiple of the
    advantage, so a sample
    with an advantage of exactly 0 has none: the trainer does not compute it, and so records no
    trainer logprobs for it (the rollout viewer says why)."""
    return advantage != 0.0 or kl_coef > 0.0


def group_advantages(rewards: Sequence[float], normalize_std: bool = False, eps: float = 1e-6) -> list[float]:
    """Reward minus the group mean; divided by the group std (population) when asked.

    A group whose rewards are all equal gets all-zero advantages (also with std
    normalisation, where the std would be 0)."""
    if len(rewards) == 0:
        raise ValueError("group_advantages: a group needs at least one reward")
    if all(reward == rewards[0] for reward in rewards):
        # Exactly zero, not a rounding residue (0.1 summed 8 times and divided by 8 is not
        # 0.1): the actor drops such groups and the trainer skips their compute by this test.
        return [0.0] * len(rewards)
    mean = sum(rewards) / len(rewards)
    centred = [reward - mean for reward in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(value * value for value in centred) / len(centred))
    return [value / (std + eps) for value in centred]


def divides_by_group_std(advantage: str, loss: str) -> bool:
    """Whether a run's advantages are divided by their group's std: `actor.advantage`
    group_mean_std asks for it, and `trainer.loss` dr_grpo never does (Dr. GRPO, Liu et al. 2025:
    the std division weights a group by how little its rewards differ, a bias towards
    too-easy and too-hard prompts): the loss decides, whatever actor.advantage says (the run
    defaults divide). The one place the actor reads the choice from."""
    return advantage == "group_mean_std" and loss != "dr_grpo"
