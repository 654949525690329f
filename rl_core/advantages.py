"""Group-relative advantages (GRPO-style, no value model): the actor scores a group of
attempts at one prompt and writes each sample's advantage into the stream; the trainer's
loss (`loss.py`) only reads it. Pure Python, so the actor needs neither torch nor the loss.
"""

from __future__ import annotations

import math
from typing import Sequence


def group_advantages(rewards: Sequence[float], normalize_std: bool = False, eps: float = 1e-6) -> list[float]:
    """Reward minus the group mean; divided by the group std (population) when asked.

    A group whose rewards are all equal gets all-zero advantages (also with std
    normalisation, where the std would be 0)."""
    if len(rewards) == 0:
        raise ValueError("group_advantages: a group needs at least one reward")
    mean = sum(rewards) / len(rewards)
    centred = [reward - mean for reward in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(value * value for value in centred) / len(centred))
    return [value / (std + eps) for value in centred]
