"""Downloads of one run: metrics (CSV, Parquet), stored rollouts (JSONL), per-problem eval
results (JSONL). The text formats stream row by row (a long run's metrics never sit in memory
whole); Parquet is columnar, so it is built in memory with pyarrow from a server-side cursor.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Iterator

from django.http import HttpResponse, StreamingHttpResponse

from inflight.rollouts.models import StoredRollout
from inflight.rollouts.selectors import detail_json, trainer_kl_coef
from inflight.runs.models import EvalProblemResult, MetricPoint, Run

EXPORT_KINDS = {
    "metrics.csv": "text/csv",
    "metrics_wide.csv": "text/csv",
    "metrics.parquet": "application/vnd.apache.parquet",
    "rollouts.jsonl": "application/x-ndjson",
    "evals.jsonl": "application/x-ndjson",
}
METRIC_COLUMNS = ("step", "t", "name", "value", "line")


def _metric_rows(run: Run) -> Iterator[tuple[Any, ...]]:
    return MetricPoint.objects.filter(run_id=run.pk).order_by("line", "name").values_list(*METRIC_COLUMNS).iterator(chunk_size=5000)


def _csv_lines(run: Run) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(METRIC_COLUMNS)
    for row in _metric_rows(run):
        writer.writerow(row)
        if buffer.tell() > 64 * 1024:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


def _wide_csv_lines(run: Run) -> Iterator[str]:
    """One row per trainer step (step, t) with one column per metric name, empty where that step
    logged no value: the shape pandas/spreadsheets chart directly. A step is logged over several
    metrics.jsonl lines (training, system, held-out evaluation): they are merged into its one row,
    the later line's value winning where two give the same metric, and `t` is the step's last.
    Points arrive ordered by (step, line), so each row is written as soon as the next step starts."""
    names = sorted(MetricPoint.objects.filter(run_id=run.pk).values_list("name", flat=True).distinct())
    column = {name: index for index, name in enumerate(names)}
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["step", "t", *names])
    current: list[Any] | None = None
    points = MetricPoint.objects.filter(run_id=run.pk).order_by("step", "line", "name").values_list("step", "t", "name", "value")
    for step, t, name, value in points.iterator(chunk_size=5000):
        if current is None or current[0] != step:
            if current is not None:
                writer.writerow(current)
            current = [step, t, *([""] * len(names))]
        if t is not None and (current[1] is None or t > current[1]):
            current[1] = t
        current[2 + column[name]] = value
        if buffer.tell() > 64 * 1024:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    if current is not None:
        writer.writerow(current)
    yield buffer.getvalue()


def metrics_parquet(run: Run) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {name: [] for name in METRIC_COLUMNS}
    for row in _metric_rows(run):
        for name, value in zip(METRIC_COLUMNS, row):
            columns[name].append(value)
    schema = pa.schema([("step", pa.int64()), ("t", pa.float64()), ("name", pa.string()), ("value", pa.float64()), ("line", pa.int64())])
    table = pa.table(columns, schema=schema)
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def _rollout_lines(run: Run) -> Iterator[str]:
    kl_coef = trainer_kl_coef(run)
    for row in StoredRollout.objects.filter(run_id=run.pk).order_by("line").iterator(chunk_size=500):
        yield json.dumps(detail_json(row, kl_coef), separators=(",", ":")) + "\n"


def _eval_lines(run: Run) -> Iterator[str]:
    rows = EvalProblemResult.objects.filter(eval__run_id=run.pk).select_related("eval").order_by("eval__benchmark", "eval__step", "id")
    for row in rows.iterator(chunk_size=500):
        yield json.dumps({
            "benchmark": row.eval.benchmark, "step": row.eval.step, "k": row.eval.k, "policy_versions": row.eval.policy_versions,
            "problem_id": row.problem_id, "answer": row.answer, "samples": row.samples, "extracted": row.extracted,
            "verdicts": row.verdicts, "mean": row.mean, "pass": row.passed, "used_tool": row.used_tool,
            "samples_used_tool": row.samples_used_tool,
        }, separators=(",", ":")) + "\n"


def export_response(run: Run, kind: str) -> HttpResponse:
    """The download; KeyError for an unknown kind (the views answer 404 with the list)."""
    content_type = EXPORT_KINDS[kind]
    if kind == "metrics.parquet":
        response: HttpResponse = HttpResponse(metrics_parquet(run), content_type=content_type)
    else:
        lines = {"metrics.csv": _csv_lines, "metrics_wide.csv": _wide_csv_lines, "rollouts.jsonl": _rollout_lines, "evals.jsonl": _eval_lines}[kind](run)
        response = StreamingHttpResponse(lines, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{kind}"'
    return response
