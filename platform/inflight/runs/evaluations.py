"""Store a run's evaluations as the worker delivers evals.jsonl: the score line and its
per-problem rows, idempotent per (run, benchmark, step); the run's open pages get an
`eval.score` push after the commit."""

from __future__ import annotations

import time
from typing import Any, Iterable

from django.db import transaction

from inflight.live.broadcast import _group_send, run_group
from inflight.runs.json_rows import model_fields, rows_source, server_bound_cursor
from inflight.runs.models import EvalProblemResult, EvalScore

_EVAL_FIELDS = ("benchmark", "step", "k", "mean_at_k", "pass_at_k", "num_problems", "num_samples")


@transaction.atomic
def ingest_eval(run_id: int, eval_line: dict[str, Any], per_problem_rows: Iterable[dict[str, Any]]) -> EvalScore:
    """Store one evals.jsonl line and its per-problem rows; re-sending it updates, never duplicates."""
    missing = [name for name in _EVAL_FIELDS if name not in eval_line]
    if missing:
        raise ValueError(f"eval line is missing {', '.join(missing)}")
    score, _ = EvalScore.objects.update_or_create(
        run_id=run_id,
        benchmark=str(eval_line["benchmark"]),
        step=int(eval_line["step"]),
        defaults={
            "k": int(eval_line["k"]),
            "mean_at_k": float(eval_line["mean_at_k"]),
            "pass_at_k": float(eval_line["pass_at_k"]),
            "stderr": None if eval_line.get("stderr") is None else float(eval_line["stderr"]),
            "num_problems": int(eval_line["num_problems"]),
            "num_samples": int(eval_line["num_samples"]),
            "policy_versions": list(eval_line.get("policy_versions") or []),
            "t": float(eval_line.get("t", time.time())),
            "results_file": str(eval_line.get("results_file") or ""),
        },
    )
    rows = [
        EvalProblemResult(
            eval=score,
            problem_id=str(row["problem_id"]),
            problem=str(row.get("problem") or ""),
            answer=str(row.get("answer", "")),
            samples=list(row.get("samples") or []),
            extracted=list(row.get("extracted") or []),
            verdicts=[bool(v) for v in row.get("verdicts") or []],
            mean=float(row.get("mean", 0.0)),
            passed=bool(row.get("pass", False)),
            # A tool env's evaluation says whether the problem's samples called the tool; absent
            # (a single-turn env) stays unknown, never "no".
            used_tool=None if row.get("used_tool") is None else bool(row["used_tool"]),
        )
        for row in per_problem_rows
    ]
    if rows:
        _insert_problem_rows(rows)
    message = {"type": "eval.score", "run_id": run_id, "benchmark": score.benchmark, "step": score.step, "mean_at_k": score.mean_at_k, "pass_at_k": score.pass_at_k, "k": score.k}
    transaction.on_commit(lambda: _group_send(run_group(run_id), message))
    return score


def _insert_problem_rows(rows: list[EvalProblemResult]) -> None:
    """An evaluation's per-problem rows, those not stored yet (a re-sent line adds nothing), as one
    JSON document (`json_rows`): 200 runs' evaluations arrive together and their quoted samples
    were the burst that held every run's metrics back (bench/platform_scale.py)."""
    columns, source, params = rows_source(rows, model_fields(EvalProblemResult))
    with server_bound_cursor() as cursor:
        cursor.execute(f"INSERT INTO {EvalProblemResult._meta.db_table} ({columns}) {source} ON CONFLICT (eval_id, problem_id) DO NOTHING", params)
