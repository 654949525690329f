"""The run config's `monitoring` section: what watches a run rather than runs it (the rollouts the
platform keeps, the built-in alert rules, metric mirrors, the hang limit). Read by the platform,
the trainer (which steps it records) and the launcher (mirrors, the watchdog)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_core.config.section import ConfigSection as _Section

class RolloutStoreConfig(_Section):
    """What the platform keeps of a run's rollouts. The trainer reads `train_logprobs` and
    `keep_every_n_steps` (which steps it records); the rest is the platform's."""

    keep_every_n_steps: int = Field(
        5, ge=1, description="Store every group trained at every Nth trainer step (eval samples are always stored)."
    )
    max_stored: int = Field(
        5000, ge=16, le=1_000_000,
        description="Most rollouts stored per run: when exceeded, the stored steps are thinned to every 2Nth, 4Nth, ... step.",
    )
    train_logprobs: bool = Field(
        True,
        description="The trainer records each token's logprob at training time (train_logprobs.jsonl) for the samples "
        "of every `keep_every_n_steps`th step, so the viewer can colour tokens by importance ratio.",
    )


class AlertsConfig(_Section):
    """Thresholds of the built-in alert rules, evaluated by the platform as metrics arrive."""

    enabled: bool = Field(True, description="Evaluate the built-in alert rules for this run.")
    reward_window: int = Field(10, ge=1, description="Steps averaged for the reward-collapse rule.")
    reward_drop: float = Field(
        0.3, gt=0, description="Reward collapse: the mean of the last `reward_window` steps fell this far below its best."
    )
    heldout_window: int = Field(2, ge=1, description="Held-out points averaged for the held-out-collapse rule.")
    heldout_drop: float = Field(
        0.2, gt=0, description="Held-out collapse: the mean of the last `heldout_window` points fell this far below its best."
    )
    entropy_min: float = Field(
        0.02, ge=0, description="Entropy collapse: the mean `train/entropy` of the last `entropy_window` steps is below this (nats per token)."
    )
    # One step's train/entropy is measured on that step's trained (non-zero-advantage) tokens
    # only, sometimes a few hundred: on the demo it dips to half its level for a single step
    # while the 10-step mean stays above 0.025 (bench/RESULTS.md, issue 26).
    entropy_window: int = Field(10, ge=1, description="Steps averaged for the entropy-collapse rule.")
    stale_dropped_max: int = Field(
        0, ge=0, description="Alert when a run has dropped more than this many stale samples (`train/dropped_stale`)."
    )
    stall_s: float = Field(120.0, gt=0, description="Throughput stalled: no metrics for this many seconds while running.")
    eval_drop: float = Field(0.1, gt=0, description="An evaluation's mean@k fell this far below its best for the benchmark.")
    no_signal_window: int = Field(
        10, ge=1,
        description="No learning signal: alert when this many values in a row of `train/reward_mean` are 0, of "
        "`rollout/zero_advantage_share` are 1 (every group all right or all wrong) or of `train/grad_norm` are 0.",
    )
    role_silent_s: float = Field(
        30.0, gt=0,
        description="Stalled: alert when one of the run's roles (a server, a trainer rank, the actor) has answered "
        "nothing for this many seconds (the launcher's `watchdog/silent_s/<role>`); `monitoring.hang_limit_s` later fails the run.",
    )


class MirrorConfig(_Section):
    """Optional copies of the metrics for users who also keep W&B or TensorBoard."""

    sinks: list[Literal["wandb", "tensorboard"]] = Field(
        default_factory=list, description="Mirror every metric to these (wandb and tensorboard are optional installs)."
    )
    wandb_project: str = Field("inflight", description="W&B project of the mirrored run.")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline", description="W&B mode: `offline` writes under the run directory only (sync it later with `wandb sync`)."
    )


class MonitoringConfig(_Section):
    rollouts: RolloutStoreConfig = Field(default_factory=RolloutStoreConfig, description="Rollouts kept for the viewer.")
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, description="Built-in alert rules.")
    mirror: MirrorConfig = Field(default_factory=MirrorConfig, description="Mirror metrics to W&B / TensorBoard.")
    # Minutes, not seconds: a role answers from a thread or its HTTP loop even through a large
    # model's long step or generation, so this measures silence, never how long work takes.
    hang_limit_s: float = Field(
        300.0, ge=10,
        description="Fail the run, naming the role, when one of its roles has answered nothing for this many seconds: an "
        "inference server's GET /health, a trainer rank's or the actor's heartbeat (a stopped or wedged process). "
        "A slow step or generation keeps answering and never trips it.",
    )
