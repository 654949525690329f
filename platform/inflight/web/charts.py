"""Which metric goes on which chart of the run page (matched by regular expression, first match wins).

Series that match no chart get a chart of their own prefix under "More metrics",
so a metric the engine starts logging tomorrow is shown without a change here.
"""

from __future__ import annotations

CHART_GROUPS: list[dict[str, object]] = [
    {"id": "reward", "title": "Reward & success rate", "patterns": [r"^reward/", r"^success/"], "y": "value"},
    {"id": "eval", "title": "Benchmarks (mean@k)", "patterns": [r"^eval/"], "y": "score"},
    {"id": "lag", "title": "Policy lag (versions)", "patterns": [r"^policy_lag/"], "y": "versions"},
    {"id": "throughput", "title": "Throughput", "patterns": [r"tokens_per_s$", r"samples_per_s$", r"^throughput/"], "y": "per second"},
    {"id": "pause", "title": "Weight-update pause", "patterns": [r"pause", r"^weights/"], "y": "seconds / version"},
    {"id": "util", "title": "CPU / GPU utilisation", "patterns": [r"^system/.*util"], "y": "%"},
    {"id": "mem", "title": "Memory", "patterns": [r"^system/.*mem"], "y": "value"},
    {"id": "loss", "title": "Loss", "patterns": [r"^train/loss", r"^loss/"], "y": "loss"},
    {"id": "optim", "title": "Entropy, grad norm, ESS", "patterns": [r"entropy", r"grad_norm", r"ess", r"^train/lr$", r"kl"], "y": "value"},
    {"id": "spec", "title": "Speculation (HistoSpec)", "patterns": [r"^spec/"], "y": "value"},
    {"id": "sched", "title": "Scheduling (HistoPipe, tail batching)", "patterns": [r"^sched/"], "y": "value"},
]
