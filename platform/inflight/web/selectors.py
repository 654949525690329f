"""Read-side helpers of the pages that the backend's selectors do not cover.

Everything here takes runs already filtered by `inflight.runs.selectors.runs_visible_to`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from django.db import connection

from inflight.runs.models import EvalScore, Run
from inflight.runs.selectors import eval_problem_results, eval_scores
from rl_core.config.benchmarks import HELDOUT_BENCHMARK
from rl_core.common import metric_names as mn


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


def solved_with_tool(passed: bool, used_tool: bool | None, verdicts: list[bool], samples_used_tool: list[bool] | None) -> bool | None:
    """Whether a correct sample of the problem called the tool (None: the evaluation did not record
    tool use). Per sample when recorded: a problem one sample solved without the tool while another
    called it and failed was not solved with the tool. Else the problem's flag: solved and called."""
    if samples_used_tool is not None and len(samples_used_tool) == len(verdicts):
        return any(correct and used for correct, used in zip(verdicts, samples_used_tool))
    if used_tool is None:
        return None
    return passed and used_tool


def latest_evaluations(run: Run) -> list[dict[str, Any]]:
    """Per benchmark: the latest evaluation, its per-problem results, and which flipped vs the previous one.

    A problem "flipped up" if it is solved (pass@k) now and was not in the previous
    evaluation of the same benchmark, "flipped down" for the reverse.
    """
    by_benchmark: dict[str, list[EvalScore]] = {}
    for score in eval_scores(run):
        by_benchmark.setdefault(score.benchmark, []).append(score)
    out = []
    for benchmark, scores in sorted(by_benchmark.items(), key=lambda item: (item[0] != HELDOUT_BENCHMARK, item[0])):
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
                    "problem": row.problem,
                    "answer": row.answer,
                    "mean": row.mean,
                    "passed": row.passed,
                    "used_tool": row.used_tool,
                    "solved_with_tool": solved_with_tool(row.passed, row.used_tool, row.verdicts, row.samples_used_tool),
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
                # The actor's held-out evaluation is reported like a benchmark; say what it is.
                "title": "held-out set (the task's problems never trained on)" if benchmark == HELDOUT_BENCHMARK else benchmark,
                "latest": latest,
                "previous": previous,
                "history": scores,
                "problems": problems,
                "flipped_up": flipped_up,
                "flipped_down": flipped_down,
                # A tool env's evaluation records per problem whether its samples called the tool:
                # only then does the table have a column for it.
                "tool_recorded": any(item["used_tool"] is not None for item in problems),
            }
        )
    return out


# ---------------------------------------------------------------- the run list as a triage table

# Latest-value columns of the run list: key → (metric, header, what it is). The first two are
# shown by default; the others are offered by the column picker (run_list.js).
TRIAGE_METRICS: dict[str, tuple[str, str, str]] = {
    # What each is comes from the names' owner, so a header never describes another role's
    # series ("Reward" is the actor's latest rollouts, not the trainer's batch: train/reward_mean).
    key: (metric, header, mn.DESCRIPTIONS[metric])
    for key, metric, header in (
        ("heldout", mn.HELDOUT_SUCCESS, "Held-out"),
        ("reward", mn.ROLLOUT_REWARD_MEAN, "Reward"),
        ("loss", mn.TRAIN_LOSS, "Loss"),
        ("tokens_per_s", mn.ROLLOUT_TOKENS_PER_S, "Tokens/s"),
        ("lag", mn.POLICY_LAG_MAX, "Max lag"),
        ("kl", mn.TRAIN_KL, "KL"),
    )
}
SPARKLINE_METRICS = (mn.ROLLOUT_REWARD_MEAN, mn.HELDOUT_SUCCESS)
# Every column of the run list the user may hide or show (run_list.js keeps the choice in the
# browser): key → (header, shown by default). Sortable ones keep their sort link.
LIST_PICKABLE_COLUMNS: dict[str, tuple[str, bool]] = {
    "tags": ("Tags", True),
    "owner": ("Owner", True),
    "mode": ("Mode", True),
    "queue": ("Queue", False),
    "status": ("Status", True),
    "progress": ("Progress", True),
    "heldout": ("Held-out", True),
    "reward": ("Reward", True),
    "trend": ("Reward trend", True),
    "heldout_trend": ("Held-out trend", False),
    "loss": ("Loss", False),
    "tokens_per_s": ("Tokens/s", False),
    "lag": ("Max lag", False),
    "kl": ("KL", False),
    "lr": ("Learning rate", False),
    "created": ("Created", True),
    "started": ("Started", False),
    "wall": ("Wall time", True),
}
SPARKLINE_POINTS = 40


def _thin(values: list[float], points: int = SPARKLINE_POINTS) -> list[float]:
    """At most `points` values, evenly picked, the first and the last kept."""
    if len(values) <= points:
        return values
    return [values[round(i * (len(values) - 1) / (points - 1))] for i in range(points)]


def triage(runs: list[Run]) -> dict[int, dict[str, Any]]:
    """Per run id: progress (`step` of `max_steps`), the latest value of each TRIAGE_METRICS and a
    sparkline of each SPARKLINE_METRICS. Read from the live charts' stored summary (one bucket row
    per metric and grid cell, `inflight.live`), never from the raw points: a list of 200 runs
    costs two indexed queries however long the runs are."""
    from inflight.live.models import SnapshotBucket, SnapshotCursor

    ids = [run.pk for run in runs]
    steps = dict(SnapshotCursor.objects.filter(run_id__in=ids).values_list("run_id", "max_step"))
    names = {metric for metric, _, _ in TRIAGE_METRICS.values()} | set(SPARKLINE_METRICS)
    series: dict[tuple[int, str], list[float]] = {}
    latest: dict[tuple[int, str], float] = {}
    # One row per (run, metric), its values as an array built in PostgreSQL: a row per bucket
    # (200 runs x 5 metrics x up to 1,000 buckets) cost ~0.4 s in Python alone (bench/platform_scale.py).
    # A metric with no sparkline needs only its last bucket.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT run_id, name, CASE WHEN name = ANY(%s) THEN array_agg(last_value ORDER BY bucket) "
            f"ELSE ARRAY[(array_agg(last_value ORDER BY bucket DESC))[1]] END "
            f"FROM {SnapshotBucket._meta.db_table} WHERE run_id = ANY(%s) AND name = ANY(%s) GROUP BY run_id, name",
            [list(SPARKLINE_METRICS), ids, sorted(names)],
        )
        for run_id, name, values in cursor.fetchall():
            series[(run_id, name)] = values
            latest[(run_id, name)] = values[-1]
    out = {}
    for run in runs:
        max_steps = int(((run.config or {}).get("trainer") or {}).get("max_steps") or 0) or None
        step = steps.get(run.pk)
        out[run.pk] = {
            "step": step,
            "max_steps": max_steps,
            "progress": None if step is None or not max_steps else min(1.0, step / max_steps),
            "latest": {key: latest.get((run.pk, metric)) for key, (metric, _, _) in TRIAGE_METRICS.items()},
            "sparklines": {name: _thin(series.get((run.pk, name), [])) for name in SPARKLINE_METRICS},
        }
    return out


def status_rows(runs: Iterable[Run], with_progress: bool = False) -> list[dict[str, Any]]:
    """What the runs list refreshes: status, error and timing of each run; `with_progress`: also
    its step, held-out success and reward (`triage`), for the triage table's live cells."""
    runs = list(runs)
    progress = triage(runs) if with_progress else {}
    rows = []
    for run in runs:
        row: dict[str, Any] = {
            "id": run.pk,
            "status": run.status,
            "error": run.error,
            "wall_time_s": run.wall_time_s,
            "is_terminal": run.is_terminal,
        }
        if run.pk in progress:
            info = progress[run.pk]
            # The sparklines as the page draws them (one drawing: the `sparkline` filter), so the
            # list's trend cells follow a live run instead of staying as the page loaded them.
            from inflight.web.templatetags.inflight_ui import sparkline

            row.update(step=info["step"], max_steps=info["max_steps"], latest=info["latest"],
                       sparklines={name: str(sparkline(values)) for name, values in info["sparklines"].items()})
        rows.append(row)
    return rows
