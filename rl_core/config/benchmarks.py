"""The benchmarks a run or `python -m rl_core eval` can evaluate on: names, data files, default k.

A table of the config's floor (no torch, no engine): the run config validates `eval.benchmarks`
against it at submit, the evaluator loads and scores them, the platform names the held-out set
by `HELDOUT_BENCHMARK`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    path: str | None  # relative to the data dir; None = built in (synthetic)
    default_k: int
    template: str = "system"


BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("math500", "math500/test.jsonl", default_k=4),
    "aime24": Benchmark("aime24", "aime24/test.jsonl", default_k=16),
    "aime25": Benchmark("aime25", "aime25/test.jsonl", default_k=16),
    "gsm8k": Benchmark("gsm8k", "gsm8k/test.jsonl", default_k=4),
    # The held-out arithmetic set of the default synthetic task: the tiny model's own benchmark.
    "synthetic": Benchmark("synthetic", None, default_k=4, template="tiny"),
}


# The name the task's held-out set is evaluated and reported under (evals.jsonl's `benchmark`,
# `eval/step_XXXXXX_heldout.jsonl`): the run's own held-out problems, not a file benchmark.
HELDOUT_BENCHMARK = "heldout"
