"""Store a run's evaluations as the worker delivers evals.jsonl: the score line and its
per-problem rows, idempotent per (run, benchmark, step), in one statement; the run's open pages
get an `eval.score` push after the commit. A worker hands them to its evaluation writer
(`submit_eval`, `runs.writer_thread`): storing them on the supervisor's own thread held back the
metrics of every other run it polls (bench/platform_scale.py, 200 live runs: 245 thread-seconds of
evaluations per replay)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any, Iterable

from django.db import connection, models

from inflight.live.broadcast import push_on_commit, run_group
from inflight.runs.json_rows import model_fields, rows_source, server_bound_cursor
from inflight.runs.models import EvalProblemResult, EvalScore
from inflight.runs.writer_thread import WriterThread

_EVAL_FIELDS = ("benchmark", "step", "k", "mean_at_k", "pass_at_k", "num_problems", "num_samples")
_SCORE_KEY = ("run", "benchmark", "step")  # its unique constraint: a re-sent line updates this row
_ROW_FIELDS = tuple(f for f in model_fields(EvalProblemResult) if f.name != "eval")


def ingest_eval(run_id: int, eval_line: dict[str, Any], per_problem_rows: Iterable[dict[str, Any]]) -> EvalScore:
    """Store one evals.jsonl line and its per-problem rows; re-sending it updates, never duplicates.
    One statement (its own transaction, or part of the caller's): the score upserted and the rows
    not stored yet inserted under its id. `update_or_create` and a second insert cost six round
    trips (BEGIN, SELECT ... FOR UPDATE, savepoint, INSERT, the rows, COMMIT), a third of an ingest
    thread's time at 200 live runs (bench/platform_scale.py, py-spy, 2026-11-28)."""
    missing = [name for name in _EVAL_FIELDS if name not in eval_line]
    if missing:
        raise ValueError(f"eval line is missing {', '.join(missing)}")
    score = EvalScore(
        run_id=run_id,
        benchmark=str(eval_line["benchmark"]),
        step=int(eval_line["step"]),
        k=int(eval_line["k"]),
        mean_at_k=float(eval_line["mean_at_k"]),
        pass_at_k=float(eval_line["pass_at_k"]),
        stderr=None if eval_line.get("stderr") is None else float(eval_line["stderr"]),
        num_problems=int(eval_line["num_problems"]),
        num_samples=int(eval_line["num_samples"]),
        policy_versions=list(eval_line.get("policy_versions") or []),
        t=float(eval_line.get("t", time.time())),
        results_file=str(eval_line.get("results_file") or ""),
    )
    # Each row as `json_rows.rows_source` takes it: every field of EvalProblemResult but `eval`.
    rows = [
        {
            "problem_id": str(row["problem_id"]),
            "problem": str(row.get("problem") or ""),
            "answer": str(row.get("answer", "")),
            "samples": list(row.get("samples") or []),
            "extracted": list(row.get("extracted") or []),
            "verdicts": [bool(v) for v in row.get("verdicts") or []],
            "mean": float(row.get("mean", 0.0)),
            "passed": bool(row.get("pass", False)),
            # A tool env's evaluation says whether the problem's samples called the tool; absent
            # (a single-turn env) stays unknown, never "no".
            "used_tool": None if row.get("used_tool") is None else bool(row["used_tool"]),
            "samples_used_tool": [bool(v) for v in row["samples_used_tool"]] if isinstance(row.get("samples_used_tool"), list) else None,
        }
        for row in per_problem_rows
    ]
    score_fields = model_fields(EvalScore)
    # The rows as one JSON document (`json_rows`): 200 runs' evaluations arrive together and their
    # quoted samples were the burst that held every run's metrics back (bench/platform_scale.py).
    columns, source, row_params = rows_source(rows, _ROW_FIELDS)
    score_values = [f.get_db_prep_save(getattr(score, f.attname), connection) for f in score_fields]
    with server_bound_cursor() as cursor:
        cursor.execute(_ingest_sql(score_fields, columns, source), [*score_values, *row_params])
        score.pk = cursor.fetchone()[0]
    score._state.adding = False
    message = {"type": "eval.score", "run_id": run_id, "benchmark": score.benchmark, "step": score.step, "mean_at_k": score.mean_at_k, "pass_at_k": score.pass_at_k, "k": score.k}
    push_on_commit(run_group(run_id), message)
    return score


def _ingest_sql(score_fields: tuple[models.Field, ...], row_columns: str, row_source: str) -> str:
    """Upsert the score (`%s` per field of `score_fields`), insert the rows of `row_source` not
    stored yet under its id, return the id. Column names are the models' (`json_rows`)."""
    quote = connection.ops.quote_name
    score_columns = ", ".join(quote(f.column) for f in score_fields)
    values = ", ".join(f"%s::{f.db_type(connection)}" for f in score_fields)
    key = ", ".join(quote(EvalScore._meta.get_field(name).column) for name in _SCORE_KEY)
    updated = ", ".join(f"{quote(f.column)} = EXCLUDED.{quote(f.column)}" for f in score_fields if f.name not in _SCORE_KEY)
    eval_column = quote(EvalProblemResult._meta.get_field("eval").column)
    problem_column = quote(EvalProblemResult._meta.get_field("problem_id").column)
    score_pk = quote(EvalScore._meta.pk.column)
    return (
        f"WITH score AS (INSERT INTO {EvalScore._meta.db_table} ({score_columns}) VALUES ({values}) "
        f"ON CONFLICT ({key}) DO UPDATE SET {updated} RETURNING {score_pk}), "
        f"problems AS (INSERT INTO {EvalProblemResult._meta.db_table} ({eval_column}, {row_columns}) "
        f"SELECT (SELECT {score_pk} FROM score), r.* FROM ({row_source}) AS r "
        f"ON CONFLICT ({eval_column}, {problem_column}) DO NOTHING) "
        f"SELECT {score_pk} FROM score"
    )


_writer: WriterThread[EvalScore] = WriterThread("inflight-eval-writer")


def submit_eval(run_id: int, eval_line: dict[str, Any], per_problem_rows: list[dict[str, Any]]) -> Future[EvalScore]:
    """`ingest_eval` on this process's evaluation writer; the future's result is the stored score (or
    the error: a malformed line's ValueError/KeyError/TypeError, or a database error after which the
    caller sends the line again)."""
    return _writer.submit(lambda: ingest_eval(run_id, eval_line, per_problem_rows))
