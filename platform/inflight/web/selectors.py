"""Read-side helpers of the pages that the backend's selectors do not cover.

Everything here takes runs already filtered by `inflight.runs.selectors.runs_visible_to`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from inflight.runs.models import EvalScore, Run
from inflight.runs.selectors import eval_problem_results, eval_scores


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"trainer": {"lr": 1e-4}}` → `{"trainer.lr": 1e-4}` (lists stay values)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, path + "."))
        else:
            out[path] = value
    return out


def config_diff(runs: list[Run]) -> list[dict[str, Any]]:
    """Only the config fields whose value differs between the runs: `[{"path", "values": [...]}]`."""
    flat = [flatten_config(run.config or {}) for run in runs]
    paths = sorted(set().union(*flat)) if flat else []
    missing = object()
    rows = []
    for path in paths:
        values = [item.get(path, missing) for item in flat]
        if any(value != values[0] for value in values[1:]):
            rows.append({"path": path, "values": ["—" if value is missing else value for value in values]})
    return rows


def latest_evaluations(run: Run) -> list[dict[str, Any]]:
    """Per benchmark: the latest evaluation, its per-problem results, and which flipped vs the previous one.

    A problem "flipped up" if it is solved (pass@k) now and was not in the previous
    evaluation of the same benchmark, "flipped down" for the reverse.
    """
    by_benchmark: dict[str, list[EvalScore]] = {}
    for score in eval_scores(run):
        by_benchmark.setdefault(score.benchmark, []).append(score)
    out = []
    for benchmark, scores in sorted(by_benchmark.items()):
        scores.sort(key=lambda score: score.step)
        latest = scores[-1]
        previous = scores[-2] if len(scores) > 1 else None
        before = {row.problem_id: row for row in eval_problem_results(previous)} if previous else {}
        problems = []
        flipped_up = flipped_down = 0
        for row in eval_problem_results(latest):
            earlier = before.get(row.problem_id)
            flip = ""
            if earlier is not None and earlier.passed != row.passed:
                flip = "up" if row.passed else "down"
                flipped_up += flip == "up"
                flipped_down += flip == "down"
            problems.append(
                {
                    "problem_id": row.problem_id,
                    "answer": row.answer,
                    "mean": row.mean,
                    "passed": row.passed,
                    "previous_mean": None if earlier is None else earlier.mean,
                    "flip": flip,
                    "extracted": [value for value in row.extracted if value is not None][:4],
                }
            )
        # Flipped problems first: they are what changed.
        problems.sort(key=lambda item: (item["flip"] == "", item["problem_id"]))
        out.append(
            {
                "benchmark": benchmark,
                "latest": latest,
                "previous": previous,
                "history": scores,
                "problems": problems,
                "flipped_up": flipped_up,
                "flipped_down": flipped_down,
            }
        )
    return out


def status_rows(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """What the runs list refreshes: status, error and timing of each run."""
    return [
        {
            "id": run.pk,
            "status": run.status,
            "error": run.error,
            "wall_time_s": run.wall_time_s,
            "is_terminal": run.is_terminal,
        }
        for run in runs
    ]
