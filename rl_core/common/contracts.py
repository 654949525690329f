"""The data contracts between pipeline stages.

Engine → actor: `GenerationResult` (token ids, sampling logprobs, and the policy
version that sampled each token). Actor → stream → trainer: `RolloutSample`.
Trainer → servers: `TrainerBackend.parameters_for_broadcast()` + the weight-sync
protocol in `weights/sync.py`. Every stage logs through `metrics.MetricsSink`.

These are plain dataclasses so they serialise to JSON lines for the durable
stream and cross process boundaries without pickling torch objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Protocol

if TYPE_CHECKING:  # annotations only: the actor and the platform use these records without torch
    from pathlib import Path

    import torch

    from rl_core.config.run_config import RunConfig
    from rl_core.kernels.packed_attention import PackedLayout


EVAL_PRIORITY = -1  # SamplingParams.priority of evaluation requests (rollouts keep 0)
# The token version of a tool turn's tokens (multi-turn envs): no policy sampled them, so lag and
# version figures leave them out (`RolloutSample.policy_versions`).
TOOL_TOKEN_VERSION = -1


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)
    # Texts that end a completion once its generated text contains one (vLLM's `stop`): the token
    # that completed it is the last one returned, and the result's `stop_reason` names it. A
    # multi-turn env's call delimiters, so a turn ends where its call does instead of decoding on.
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    # Admission order at a busy engine: lower first, then arrival (vLLM's convention). An
    # evaluation asks for EVAL_PRIORITY so its point is not queued behind later rollouts.
    priority: int = 0


@dataclass
class GenerationResult:
    """One finished sequence. `token_versions[i]` is the policy version whose
    weights sampled `token_ids[i]`: a sequence spanning an in-flight weight
    update carries more than one distinct version."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    text: str = ""
    stop_reason: str | None = None  # the `SamplingParams.stop` text that ended it, if one did

    @property
    def num_versions(self) -> int:
        return len(set(self.token_versions))


# Why a sample was never trained (the rollout viewer shows each). The actor writes the first three
# to `stream/discarded.jsonl` instead of the stream: its group's advantages were all equal and the
# run drops such groups (`actor.drop_zero_advantage_groups`, or dapo, which draws the prompt
# again); its server aborted the response; or it has no token at all. The trainer drops a stream
# sample whose tokens are past `actor.max_lag` (`stale`) and says which in train_logprobs.jsonl
# (`trainer/train_records.py`).
DISCARD_ZERO_ADVANTAGE = "zero_advantage"
DISCARD_ABORTED = "aborted"
DISCARD_EMPTY = "empty"
DISCARD_STALE = "stale"
ACTOR_DISCARD_REASONS = (DISCARD_ZERO_ADVANTAGE, DISCARD_ABORTED, DISCARD_EMPTY)
DISCARD_REASONS = (*ACTOR_DISCARD_REASONS, DISCARD_STALE)


@dataclass
class RolloutSample:
    """One scored attempt, as written to the actor→trainer stream."""

    sample_id: str
    group_id: str
    prompt_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    behaviour_logprobs: list[float]
    token_versions: list[int]
    reward: float
    success: bool
    advantage: float
    finish_reason: str = "stop"
    metadata: dict[str, Any] = field(default_factory=dict)
    # Per completion token: 1 = the policy's (trained), 0 = a tool turn's output (context only:
    # behaviour logprob 0.0, version TOOL_TOKEN_VERSION). None = all ones, so older streams still read.
    # A multi-turn sample's `metadata` also has "turns" ([{"kind": "model"|"tool", "start", "end"}
    # completion-token offsets; a tool turn also "status" and "seconds"]), "tool_calls" and "env".
    completion_mask: list[int] | None = None
    # Why this sample was not trained (`DISCARD_REASONS`); None for a sample of the stream. Only
    # lines of `stream/discarded.jsonl` carry one, so the trainer's stream lines stay as they were.
    discarded: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if data["discarded"] is None:
            del data["discarded"]  # a stream line keeps its old shape (and byte count)
        return data

    def trained_mask(self) -> list[int]:
        """`completion_mask`, or all ones where it is None."""
        return list(self.completion_mask) if self.completion_mask is not None else [1] * len(self.completion_token_ids)

    @property
    def num_trained_tokens(self) -> int:
        return len(self.completion_token_ids) if self.completion_mask is None else sum(self.completion_mask)

    def policy_versions(self) -> list[int]:
        """The versions of the policy's own tokens (a tool token's TOOL_TOKEN_VERSION left out)."""
        return [v for v in self.token_versions if v != TOOL_TOKEN_VERSION]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutSample:
        return cls(**data)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.completion_token_ids)


class TrainerBackend(Protocol):
    """What the training loop needs from a backend (plain torch or DeepSpeed).

    The loop owns batching, the loss and the stream; the backend owns the
    model, the optimizer and the parallelism."""

    version: int  # optimizer steps taken == policy version of the current weights

    @classmethod
    def from_config(cls, config: RunConfig, model_path: str | Path) -> TrainerBackend:
        """The backend of a run, from its config and the initial weights (`trainer.make_backend`)."""
        ...

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        temperature: float = 1.0, logit_source: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of each token under its context (with grad) and the entropy of that
        distribution, under softmax(logits / temperature): the distribution the rollouts were
        sampled from: [B, T] aligned with input_ids. A packed micro-batch passes its 4-D mask,
        its `packed_layout` and its terms (`target_ids` scored at `logit_source`, loss.py) and
        gets [B, K]; a backend may attend by the layout or by the mask."""
        ...

    def reference_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
        temperature: float = 1.0, logit_source: torch.Tensor | None = None, packed_layout: PackedLayout | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The frozen reference model's token logprobs (no grad), for the KL term; only
        backends built with a reference model (`trainer.kl_coef > 0`) answer."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def optimizer_step(self) -> dict[str, float]:
        """Clip, step, schedule, zero grads, bump `version`; returns e.g. grad_norm, lr."""
        ...

    def parameters_for_broadcast(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) parameters in HF naming, in a stable order, for the servers."""
        ...

    def save_checkpoint(self, directory: str) -> None: ...

    def load_checkpoint(self, directory: str) -> None: ...
