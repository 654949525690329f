"""Which metric goes on which chart of the run page (JS regular expressions, first match wins).

Series that match no chart get a chart of their own prefix after these, so a
metric the engine starts logging tomorrow is shown without a change here.

Each chart holds metrics of one unit and scale, so none squashes another on a linear axis
(counters that grow with the run, like samples written, are apart from queue depths; seconds of a
trainer step apart from the sub-second weight-update pause). `y` is the axis title.
Whatever the grouping, charts.js `fitChart` gives a chart whose positive values span decades a
log axis (the catch-all chart of an unknown prefix too), and draws a chart whose every series
stays constant small, after the others — except a chart marked `learning_signal` (reward and
success, evaluations, loss, gradient norm): one of those stuck at a constant (a reward of 0 from
step 1, a zero gradient) is the run failing to learn, the thing its page must show first, not demote.
"""

from __future__ import annotations

import re

from rl_core.common import metric_names as m


def _exact(*names: str) -> list[str]:
    return [f"^{re.escape(name)}$" for name in names]


def _help(*names: str) -> str:
    """A chart's hover help: what each of its series is, in metric_names' words (their one source)."""
    return "\n".join(f"{name}: {m.DESCRIPTIONS[name]}" for name in names)


# Legend names of the Tools charts' series: short enough for a chart's legend, each saying what the
# curve is (the chart's title says of what; its hover help has metric_names' full description).
TOOL_LABELS: dict[str, str] = {
    m.SUCCESS_WITH_TOOL: "samples that called the tool",
    m.SUCCESS_WITHOUT_TOOL: "samples that answered without it",
    m.TOOL_CALLS_PER_SAMPLE: "tool calls per sample",
    m.ENV_TURNS_PER_SAMPLE: "turns per sample (model + tool)",
    m.TOOL_CALL_SHARE: "samples calling the tool",
    m.TOOL_ERROR_SHARE: "calls ending in an error",
    m.TOOL_TIMEOUT_SHARE: "calls timed out",
    m.TOOL_WAIT_SHARE: "rollout time waiting on tools",
    m.TOOL_BUSY_SHARE: "rollout time with a call running",
    m.TOOL_SECONDS_MEAN: "seconds per call (mean)",
    m.ENV_PREFIX_REUSE_TOKENS: "prefix tokens reused",
}


def _tools_chart(chart_id: str, title: str, y: str, *names: str, **extra: object) -> dict[str, object]:
    return {"id": chart_id, "title": title, "section": "Tools", "patterns": _exact(*names), "y": y,
            "labels": {name: TOOL_LABELS[name] for name in names}, "help": _help(*names), **extra}


# A multi-turn env's series (issue 34), drawn together under one "Tools" heading on the run page
# (run_page.js: a chart with `section`); a run whose env calls no tool logs none of them, so it
# has no Tools charts at all. One unit per chart, as everywhere: rates, counts, shares, seconds, tokens.
TOOL_CHARTS: list[dict[str, object]] = [
    _tools_chart("tool_success", "Success rate with vs without a tool call", "success rate",
                 m.SUCCESS_WITH_TOOL, m.SUCCESS_WITHOUT_TOOL, learning_signal=True),
    _tools_chart("tool_counts", "Tool calls and turns per sample (mean)", "per sample", m.TOOL_CALLS_PER_SAMPLE, m.ENV_TURNS_PER_SAMPLE),
    _tools_chart("tool_shares", "Tool use, errors, timeouts and waiting (shares)", "share",
                 m.TOOL_CALL_SHARE, m.TOOL_ERROR_SHARE, m.TOOL_TIMEOUT_SHARE, m.TOOL_WAIT_SHARE, m.TOOL_BUSY_SHARE),
    _tools_chart("tool_seconds", "Tool call duration", "seconds", m.TOOL_SECONDS_MEAN),
    _tools_chart("tool_prefix", "Prefix reused across turns (server cache)", "tokens", m.ENV_PREFIX_REUSE_TOKENS),
]

CHART_GROUPS: list[dict[str, object]] = [
    {"id": "reward", "title": "Reward & success rate", "patterns": [r"^reward/", r"^success/(?!heldout_version)", r"^train/reward_mean$", r"^rollout/zero_advantage_share$"], "y": "rate", "learning_signal": True},
    {"id": "eval", "title": "Evaluations (mean@k, pass@k)", "patterns": [r"^eval/[^/]+/(mean|pass)_at_k$"], "y": "score", "learning_signal": True},
    {"id": "lag_share", "title": "Trained tokens by policy lag (share per step)", "patterns": [r"^policy_lag/share/"], "y": "share"},
    {"id": "lag", "title": "Policy lag (versions)", "patterns": [r"^policy_lag/", r"^rollout/versions_per_sequence/"], "y": "versions"},
    {"id": "stale", "title": "Dropped as stale (samples, share of tokens)", "patterns": [r"^train/dropped_stale"], "y": "count / share"},
    {"id": "version", "title": "Policy version", "patterns": [r"^weights/version$", r"^success/heldout_version"], "y": "version"},
    {"id": "throughput", "title": "Throughput", "patterns": [r"tokens_per_s$", r"samples_per_s$"], "y": "per second"},
    {"id": "response_len", "title": "Response length", "patterns": [r"^rollout/response_len/"], "y": "tokens"},
    {"id": "actor_queue", "title": "Actor: groups in flight, finished, unconsumed", "patterns": [r"^rollout/(in_flight|groups|unconsumed|dropped_zero_advantage_groups|resampled_zero_advantage_groups)$"], "y": "groups / samples"},
    {"id": "samples", "title": "Samples written (actor) and consumed (trainer)", "patterns": [r"^rollout/samples_written$", r"^train/samples_consumed$"], "y": "samples"},
    {"id": "step_time", "title": "Trainer step time", "patterns": [r"^train/step_s$"], "y": "seconds"},
    # Which way a run's weights reach its servers (the placement picks it: inference.weight_handoff).
    {"id": "handoff", "title": "Weight handoff: 1 = same device (shared memory, CUDA IPC), 0 = process group", "patterns": [r"^weights/same_device_handoff$"], "y": "path"},
    {"id": "pause", "title": "Weight-update pause", "patterns": [r"^weights/"], "y": "seconds"},
    # rl_core/launch/watchdog.py: seconds since the quietest role answered (a few normally; each role silent long enough by name).
    {"id": "watchdog", "title": "Roles answering: longest silence (watchdog)", "patterns": [r"^watchdog/silent_s"], "y": "seconds"},
    {"id": "lr", "title": "Learning rate", "patterns": [r"^train/lr$"], "y": "lr"},
    {"id": "proc_cpu", "title": "CPU per process (trainer, servers, actor)", "patterns": [r"^system/proc/[^/]+/cpu_percent$"], "y": "% of one core"},
    {"id": "proc_mem", "title": "Memory per process (resident)", "patterns": [r"^system/proc/[^/]+/rss_mb$"], "y": "MiB"},
    {"id": "proc_gpu_mem", "title": "GPU memory per process", "patterns": [r"^system/proc/[^/]+/gpu_mem_mb$"], "y": "MiB"},
    {"id": "util", "title": "CPU / GPU utilisation", "patterns": [r"^system/.*util"], "y": "%"},
    {"id": "gpu_mem", "title": "GPU memory", "patterns": [r"^system/gpu\d+/mem"], "y": "memory"},
    {"id": "loss", "title": "Loss", "patterns": [r"^train/loss$"], "y": "loss", "learning_signal": True},
    {"id": "entropy", "title": "Entropy & KL", "patterns": [r"^train/(entropy|kl)$"], "y": "nats"},
    {"id": "ess", "title": "ESS, clip fraction per side & masked share", "patterns": [r"^train/(ess|clip_fraction|clip_low_fraction|clip_high_fraction|masked_fraction)$"], "y": "fraction"},
    {"id": "grad_norm", "title": "Gradient norm", "patterns": [r"^train/grad_norm$"], "y": "norm", "learning_signal": True},
    {"id": "spec", "title": "Speculation (HistoSpec): acceptance", "patterns": [r"^spec/(acceptance_rate|mean_accepted_len)$"], "y": "rate / tokens"},
    {"id": "spec_tokens", "title": "Speculation (HistoSpec): drafted tokens", "patterns": [r"^spec/"], "y": "tokens"},
    {"id": "sched", "title": "Scheduling (HistoPipe, tail batching)", "patterns": [r"^sched/"], "y": "value"},
    # The objectives' own readings (rl_core/trainer/losses.py LossTotals): how far off-policy the batch was,
    # M2PO's mask bound; GSPO's sequence ratio, whose clip range is ~1e-4 wide.
    {"id": "log_ratio", "title": "Off-policy: second moment of the log ratio, mean (log r)^2", "patterns": [r"^train/log_ratio_m2$"], "y": "nats^2"},
    {"id": "seq_ratio", "title": "Sequence ratio (GSPO): mean & spread", "patterns": [r"^train/seq_ratio_"], "y": "ratio"},
    *TOOL_CHARTS,
]
