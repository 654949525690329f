"""Which metric goes on which chart of the run page (JS regular expressions, first match wins).

Series that match no chart get a chart of their own prefix after these, so a
metric the engine starts logging tomorrow is shown without a change here.
"""

from __future__ import annotations

CHART_GROUPS: list[dict[str, object]] = [
    {"id": "reward", "title": "Reward & success rate", "patterns": [r"^reward/", r"^success/(?!heldout_version)"], "y": "rate"},
    {"id": "eval", "title": "Benchmarks (mean@k, pass@k)", "patterns": [r"^eval/[^/]+/(mean|pass)_at_k$"], "y": "score"},
    {"id": "lag_share", "title": "Trained tokens by policy lag (share per step)", "patterns": [r"^policy_lag/share/"], "y": "share"},
    {"id": "lag", "title": "Policy lag (versions)", "patterns": [r"^policy_lag/", r"^rollout/versions_per_sequence/"], "y": "versions"},
    {"id": "stale", "title": "Dropped as stale (samples, share of tokens)", "patterns": [r"^train/dropped_stale"], "y": "count / share"},
    {"id": "version", "title": "Policy version", "patterns": [r"^weights/version$", r"^success/heldout_version"], "y": "version"},
    {"id": "throughput", "title": "Throughput", "patterns": [r"tokens_per_s$", r"samples_per_s$"], "y": "per second"},
    {"id": "pause", "title": "Weight-update pause", "patterns": [r"^weights/"], "y": "seconds"},
    {"id": "util", "title": "CPU / GPU utilisation", "patterns": [r"^system/.*util"], "y": "%"},
    {"id": "gpu_mem", "title": "GPU memory", "patterns": [r"^system/gpu\d+/mem"], "y": "memory"},
    {"id": "loss", "title": "Loss", "patterns": [r"^train/loss$"], "y": "loss"},
    {"id": "entropy", "title": "Entropy & KL", "patterns": [r"^train/(entropy|kl)$"], "y": "nats"},
    {"id": "ess", "title": "ESS & clip fraction", "patterns": [r"^train/(ess|clip_fraction)$"], "y": "fraction"},
    {"id": "grad_norm", "title": "Gradient norm", "patterns": [r"^train/grad_norm$"], "y": "norm"},
    {"id": "spec", "title": "Speculation (HistoSpec)", "patterns": [r"^spec/"], "y": "value"},
    {"id": "sched", "title": "Scheduling (HistoPipe, tail batching)", "patterns": [r"^sched/"], "y": "value"},
]
