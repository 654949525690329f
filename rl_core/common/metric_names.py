"""The one owner of the metric names read in more than one place.

A metric's name is a contract between the role that writes it (the actor, the trainer, the weight
sync) and everything that reads it back: the console bar, the platform's run list, leaderboard,
charts and alerts, the pages' scripts (through the page context, `METRIC_NAMES_FOR_PAGES`) and
the command-line client. Writers and Python readers import these constants, so a rename is one
edit here and a typo is an ImportError, not a silently empty column.

Torch-free and import-free on purpose: the platform and the command-line client (which imports
neither Django nor torch) import this module.

Two series are easy to mix up, so each constant's description says whose it is:
`ROLLOUT_REWARD_MEAN` (`reward/mean`) is the actor's mean reward over the rollouts it generated
in its latest metrics window; `TRAIN_REWARD_MEAN` (`train/reward_mean`) is the trainer's mean
reward over the batch it trained on at a step.
"""

from __future__ import annotations

from typing import Final

# --- written by the actor -----------------------------------------------------------------------
# The held-out evaluation (the task's problems never trained on), at trainer versions.
HELDOUT_SUCCESS: Final = "success/heldout"
HELDOUT_PASS_AT_K: Final = "success/heldout_pass_at_k"
HELDOUT_VERSION_MIN: Final = "success/heldout_version_min"
HELDOUT_VERSION_MAX: Final = "success/heldout_version_max"
# The rollouts generated in the actor's latest metrics window (not a training batch).
ROLLOUT_REWARD_MEAN: Final = "reward/mean"
ROLLOUT_SUCCESS_MEAN: Final = "success/mean"
ROLLOUT_TOKENS_PER_S: Final = "rollout/tokens_per_s"
ZERO_ADVANTAGE_SHARE: Final = "rollout/zero_advantage_share"

# Multi-turn envs (env.name math_python_tool / custom, issue 34): the actor's latest metrics window.
TOOL_CALLS_PER_SAMPLE: Final = "tool/calls_per_sample"
TOOL_CALL_SHARE: Final = "tool/call_share"
TOOL_ERROR_SHARE: Final = "tool/error_share"
TOOL_TIMEOUT_SHARE: Final = "tool/timeout_share"
TOOL_SECONDS_MEAN: Final = "tool/seconds_mean"
TOOL_WAIT_SHARE: Final = "tool/wait_share"
TOOL_BUSY_SHARE: Final = "tool/busy_share"
ENV_TURNS_PER_SAMPLE: Final = "env/turns_per_sample"
SUCCESS_WITH_TOOL: Final = "rollout/success_with_tool"
SUCCESS_WITHOUT_TOOL: Final = "rollout/success_without_tool"
ENV_PREFIX_REUSE_TOKENS: Final = "env/prefix_reuse_tokens"

# --- written by the trainer, once per optimizer step --------------------------------------------
TRAIN_LOSS: Final = "train/loss"
TRAIN_GRAD_NORM: Final = "train/grad_norm"
TRAIN_LR: Final = "train/lr"
TRAIN_ENTROPY: Final = "train/entropy"
TRAIN_KL: Final = "train/kl"
TRAIN_REWARD_MEAN: Final = "train/reward_mean"
TRAIN_DROPPED_STALE: Final = "train/dropped_stale"
POLICY_LAG_MAX: Final = "policy_lag/max"
WEIGHTS_VERSION: Final = "weights/version"

# What each series is, in a reader's words: the one source of the pages' headers and hover
# titles, so a label can never describe another role's series.
DESCRIPTIONS: Final[dict[str, str]] = {
    HELDOUT_SUCCESS: "held-out success (mean@k) at the latest held-out evaluation",
    HELDOUT_PASS_AT_K: "held-out pass@k at the latest held-out evaluation",
    HELDOUT_VERSION_MIN: "oldest policy version that sampled the latest held-out evaluation",
    HELDOUT_VERSION_MAX: "newest policy version that sampled the latest held-out evaluation",
    ROLLOUT_REWARD_MEAN: "mean reward of the rollouts the actor generated in its latest metrics window",
    ROLLOUT_SUCCESS_MEAN: "success rate of the rollouts the actor generated in its latest metrics window",
    ROLLOUT_TOKENS_PER_S: "rollout tokens generated per second, latest window",
    ZERO_ADVANTAGE_SHARE: "share of the latest window's groups whose advantages are all 0",
    TRAIN_LOSS: "training loss at the latest step",
    TRAIN_GRAD_NORM: "gradient norm at the latest step",
    TRAIN_LR: "learning rate at the latest step",
    TRAIN_ENTROPY: "policy entropy of the batch trained at the latest step",
    TRAIN_KL: "KL to the reference policy at the latest step",
    TRAIN_REWARD_MEAN: "mean reward of the batch trained at the latest step",
    TRAIN_DROPPED_STALE: "samples dropped as too stale so far",
    POLICY_LAG_MAX: "largest policy lag of a trained token at the latest step",
    WEIGHTS_VERSION: "policy version (optimizer steps taken)",
    TOOL_CALLS_PER_SAMPLE: "tool calls per sample, mean over the latest window's samples",
    TOOL_CALL_SHARE: "share of samples that called the tool at least once",
    TOOL_ERROR_SHARE: "share of tool calls that ended with status error (the code raised)",
    TOOL_TIMEOUT_SHARE: "share of tool calls stopped at the wall-clock limit (env.tool_wall_s)",
    TOOL_SECONDS_MEAN: "seconds one tool call ran, mean",
    TOOL_WAIT_SHARE: "share of rollout wall time spent waiting on tools: a call running and no generation request in flight",
    TOOL_BUSY_SHARE: "share of rollout wall time with a tool call running (other samples decode meanwhile)",
    ENV_TURNS_PER_SAMPLE: "turns per sample (model and tool turns), mean",
    SUCCESS_WITH_TOOL: "success rate of the samples that called the tool",
    SUCCESS_WITHOUT_TOOL: "success rate of the samples that answered without a tool call",
    ENV_PREFIX_REUSE_TOKENS: "tokens of a trajectory's earlier turns reused by the server's prefix cache for its next turn",
}

# The names the pages' scripts read, keyed by the constant's name (handed to them as JSON by the
# platform's context processor, so no script spells a metric name itself).
METRIC_NAMES_FOR_PAGES: Final[dict[str, str]] = {
    "HELDOUT_SUCCESS": HELDOUT_SUCCESS,
    "ROLLOUT_REWARD_MEAN": ROLLOUT_REWARD_MEAN,
    "ROLLOUT_SUCCESS_MEAN": ROLLOUT_SUCCESS_MEAN,
    "ROLLOUT_TOKENS_PER_S": ROLLOUT_TOKENS_PER_S,
    "POLICY_LAG_MAX": POLICY_LAG_MAX,
}
