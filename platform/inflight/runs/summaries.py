"""Per-run leaderboard figures (`RunSummary`), kept fresh when they are read.

The leaderboard used to read every held-out and training-batch point and every benchmark
evaluation of every listed run on each request (1.2 M rows at 2,000 runs: seconds). Now each run
has one summary row; `refresh_summaries` brings the rows of the runs about to be listed up to
date first, touching only runs whose summary is behind:

- metrics: a summary computed at Run.metrics_seq = s takes in only the points of later batches
  (seq > s, read through the (run, seq) index), so a finished run is summarised once and a live
  run costs its new points. Exact: best is a max, the last value is the highest (step, line), the
  recent mean needs the latest line of each of the last RECENT_TRAIN_STEPS steps, which the
  summary keeps (`recent`), and the throughput mean is a kept sum and count;
- evaluations: a change in the run's count or latest `t` of benchmark evaluations (a new one, or
  a re-sent one that updated its row) reads that run's few evaluations again.

A resume that rewinds a run deletes points (`actions.supersede_rewound_history`); it drops the
run's summary, which is then computed again from scratch.
"""

from __future__ import annotations

from typing import Any, Iterable

from django.db import connection, transaction
from django.db.models import Count, F, Max, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from inflight.runs.models import EvalScore, MetricPoint, Run, RunSummary

from rl_core.common import metric_names as mn

LEADERBOARD_BENCHMARKS = ("aime24", "math500")
HELDOUT_METRIC = mn.HELDOUT_SUCCESS  # the actor's held-out evaluation (also evals.jsonl's "heldout")
SUCCESS_METRIC = mn.ROLLOUT_SUCCESS_MEAN  # the actor's latest rollouts: noisy, and on problems being trained on
THROUGHPUT_METRIC = mn.ROLLOUT_TOKENS_PER_S
# The training-batch figure the leaderboard shows: the mean of the last steps, not one batch.
RECENT_TRAIN_STEPS = 10
# Runs summarised per round of queries (bounds the arrays sent and the rows read at once).
BATCH_RUNS = 500
# pg_advisory_xact_lock key of the refresh (any constant no other lock of the platform uses).
REFRESH_LOCK = 0x52756E53756D  # "RunSum"

SERIES = (HELDOUT_METRIC, SUCCESS_METRIC, THROUGHPUT_METRIC)
SUMMARY_FIGURES = (
    "heldout_best", "heldout_last", "aime24_best", "aime24_last", "math500_best", "math500_last",
    "success_best", "success_last", "success_recent", "throughput",
)


def _stale(runs: QuerySet[Run]) -> list[tuple[int, int, int | None]]:
    """(run id, its metrics_seq, the summary's metrics_seq or None) of the runs in `runs` whose
    summary is missing or behind (metrics or evaluations)."""
    evals = (
        EvalScore.objects.filter(run=OuterRef("pk"), benchmark__in=LEADERBOARD_BENCHMARKS)
        .order_by().values("run").annotate(n=Count("*"), latest=Max("t"))
    )
    behind = (
        runs.order_by()
        .annotate(evals_n=Coalesce(Subquery(evals.values("n")), Value(0)), evals_t=Coalesce(Subquery(evals.values("latest")), Value(-1.0)))
        .filter(
            Q(summary__isnull=True) | ~Q(summary__metrics_seq=F("metrics_seq")) | ~Q(summary__evals_count=F("evals_n"))
            | ~Q(evals_t=Coalesce(F("summary__evals_max_t"), Value(-1.0)))
        )
    )
    return list(behind.values_list("pk", "metrics_seq", "summary__metrics_seq"))


def refresh_summaries(runs: QuerySet[Run]) -> int:
    """Bring the summaries of `runs` up to date; returns how many were written."""
    if not _stale(runs):
        return 0
    # One refresh at a time: a second reader waits, then finds the work done (two first reads of
    # thousands of runs would each compute them all), and a summary never goes back to an older
    # seq written late by a slower reader.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [REFRESH_LOCK])
        stale = _stale(runs)
        for first in range(0, len(stale), BATCH_RUNS):
            _refresh_batch(stale[first:first + BATCH_RUNS])
    return len(stale)


def _empty_state() -> dict[str, Any]:
    return {"metrics_seq": 0, "throughput_sum": 0.0, "throughput_count": 0, "heldout_best": None, "success_best": None,
            "recent": {HELDOUT_METRIC: [], SUCCESS_METRIC: []}}


def _merge_recent(kept: list[list[Any]], new: Iterable[tuple[int, int, float]]) -> list[list[Any]]:
    """The latest line of each of the last RECENT_TRAIN_STEPS steps of old and new points
    together, by step descending. Exact: a step outside the old last steps can never come back
    among the last ones (steps are only added)."""
    by_step: dict[int, list[Any]] = {int(step): [int(step), int(line), value] for step, line, value in kept}
    for step, line, value in new:
        if step not in by_step or line > by_step[step][1]:
            by_step[step] = [step, line, value]
    return [by_step[step] for step in sorted(by_step, reverse=True)[:RECENT_TRAIN_STEPS]]


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _refresh_batch(stale: list[tuple[int, int, int | None]]) -> None:
    ids = [run_id for run_id, _, _ in stale]
    kept = {summary.run_id: summary for summary in RunSummary.objects.filter(run_id__in=ids)}
    states: dict[int, dict[str, Any]] = {}
    bounds: list[tuple[int, int, int]] = []  # (run, after seq, up to seq) of the points to fold in
    for run_id, seq, summary_seq in stale:
        old = kept.get(run_id)
        if old is not None and summary_seq is not None and summary_seq <= seq:
            state = {key: getattr(old, key) for key in ("metrics_seq", "throughput_sum", "throughput_count", "heldout_best", "success_best")}
            state["recent"] = {name: list(old.recent.get(name, [])) for name in (HELDOUT_METRIC, SUCCESS_METRIC)}
        else:  # none yet, or ahead of the run (cannot happen short of a rewrite): from scratch
            state = _empty_state()
        states[run_id] = state
        if state["metrics_seq"] < seq:
            bounds.append((run_id, state["metrics_seq"], seq))
        state["metrics_seq"] = seq
    new_recent: dict[tuple[int, str], list[tuple[int, int, float]]] = {}
    table = MetricPoint._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        if bounds:
            # The new points are read once (a materialised CTE) and give two kinds of rows: per
            # series its max, sum and count ('a'), and the latest line of each of its last steps ('r').
            # Two reads of the points: a run summarised from scratch reads its three series through
            # the (run, name, step) index; a run caught up from its summary's seq reads only the
            # later batches through the (run, seq) index ("OFFSET 0" keeps the name test out of
            # that scan, or the planner reads every point of the three series again).
            full = [b for b in bounds if b[1] == 0]
            later = [b for b in bounds if b[1] > 0]
            cursor.execute(
                f"WITH p AS MATERIALIZED ("
                f"SELECT p.run_id, p.name, p.step, p.line, p.value FROM {table} p JOIN unnest(%s::bigint[], %s::bigint[]) AS b(run_id, hi) "
                f"ON p.run_id = b.run_id AND p.seq <= b.hi WHERE p.name = ANY(%s) "
                f"UNION ALL SELECT n.run_id, n.name, n.step, n.line, n.value FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS b(run_id, lo, hi) "
                f"CROSS JOIN LATERAL (SELECT p.run_id, p.name, p.step, p.line, p.value FROM {table} p "
                f"WHERE p.run_id = b.run_id AND p.seq > b.lo AND p.seq <= b.hi OFFSET 0) n WHERE n.name = ANY(%s)) "
                f"SELECT 'a', run_id, name, max(value), sum(value), count(*), NULL::bigint, NULL::bigint FROM p GROUP BY run_id, name "
                f"UNION ALL "
                f"SELECT 'r', run_id, name, value, NULL, NULL, step, line FROM (SELECT *, row_number() OVER (PARTITION BY run_id, name ORDER BY step DESC) AS k "
                f"FROM (SELECT DISTINCT ON (run_id, name, step) * FROM p WHERE name <> %s ORDER BY run_id, name, step, line DESC) latest) ranked WHERE k <= %s",
                [[b[0] for b in full], [b[2] for b in full], list(SERIES),
                 [b[0] for b in later], [b[1] for b in later], [b[2] for b in later], list(SERIES), THROUGHPUT_METRIC, RECENT_TRAIN_STEPS],
            )
            for kind, run_id, name, value, total, count, step, line in cursor.fetchall():
                state = states[run_id]
                if kind == "r":
                    new_recent.setdefault((run_id, name), []).append((step, line, value))
                elif name == THROUGHPUT_METRIC:
                    state["throughput_sum"] += total
                    state["throughput_count"] += count
                else:
                    key = "heldout_best" if name == HELDOUT_METRIC else "success_best"
                    state[key] = _max(state[key], value)
        # Benchmark evaluations: few per run, read again whole for every run in the batch.
        evals: dict[int, dict[str, Any]] = {}
        cursor.execute(
            f"SELECT DISTINCT ON (run_id, benchmark) run_id, benchmark, mean_at_k, max(mean_at_k) OVER w, count(*) OVER r, max(t) OVER r "
            f"FROM {EvalScore._meta.db_table} WHERE run_id = ANY(%s) AND benchmark = ANY(%s) "
            f"WINDOW w AS (PARTITION BY run_id, benchmark), r AS (PARTITION BY run_id) ORDER BY run_id, benchmark, step DESC",
            [ids, list(LEADERBOARD_BENCHMARKS)],
        )
        for run_id, bench, last, best, count, latest_t in cursor.fetchall():
            row = evals.setdefault(run_id, {"evals_count": count, "evals_max_t": latest_t})
            row[f"{bench}_best"], row[f"{bench}_last"] = best, last
        summaries = []
        for run_id, state in states.items():
            recent = {name: _merge_recent(state["recent"][name], new_recent.get((run_id, name), [])) for name in (HELDOUT_METRIC, SUCCESS_METRIC)}
            train = recent[SUCCESS_METRIC]
            # The mean in step order, as the leaderboard always summed it (the same float).
            train_values = [value for _, _, value in reversed(train)]
            figures = {
                "heldout_best": state["heldout_best"],
                "heldout_last": recent[HELDOUT_METRIC][0][2] if recent[HELDOUT_METRIC] else None,
                "success_best": state["success_best"],
                "success_last": train[0][2] if train else None,
                "success_recent": sum(train_values) / len(train_values) if train_values else None,
                "throughput": state["throughput_sum"] / state["throughput_count"] if state["throughput_count"] else None,
                "evals_count": 0, "evals_max_t": None,
                **{f"{bench}_{which}": None for bench in LEADERBOARD_BENCHMARKS for which in ("best", "last")},
                **evals.get(run_id, {}),
            }
            summaries.append(RunSummary(
                run_id=run_id, metrics_seq=state["metrics_seq"], throughput_sum=state["throughput_sum"],
                throughput_count=state["throughput_count"], recent=recent, **figures,
            ))
        fields = [f.name for f in RunSummary._meta.concrete_fields if f.name != "run"]
        # Upsert: two requests refreshing the same run write the same figures (or one a later
        # seq's); each row is always one consistent (figures, seq) pair.
        RunSummary.objects.bulk_create(summaries, update_conflicts=True, unique_fields=["run"], update_fields=fields)
        # A run deleted since it was read leaves no summary behind (one whose delete is still
        # uncommitted may: a stray row that no leaderboard reads, runs are listed from runs).
        cursor.execute(f"DELETE FROM {RunSummary._meta.db_table} s WHERE s.run_id = ANY(%s) "
                       f"AND NOT EXISTS (SELECT 1 FROM {Run._meta.db_table} r WHERE r.id = s.run_id)", [ids])


def drop_summary(run_id: int) -> None:
    """Forget a run's summary (its history was rewritten): the next read computes it again."""
    RunSummary.objects.filter(run_id=run_id).delete()
