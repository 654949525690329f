"""Filtering and sorting run lists: the runs page, compare's run picker, the leaderboard and
`GET /api/runs/` accept the same query parameters.

    status=<status>   tag=<tag>   q=<text in the name>   owner=<username> (staff)
    archived=0 (default: hidden) | 1 (only archived) | all
    sort=<column> or -<column>, column in RUN_SORT_KEYS
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import F, FloatField, QuerySet
from django.db.models.expressions import RawSQL

from inflight.runs.models import RUN_WALL_TIME_SQL, Run, RunStatus
from rl_core.common import metric_names as mn

RUN_SORT_KEYS = {
    "id": "id", "name": "name", "status": "status", "created": "created_at", "started": "started_at",
    "finished": "finished_at", "queue": "queue", "owner": "owner__username", "mode": "config__mode",
}
# The run list's figure columns, sortable in the database from what is stored per run: the latest
# value of a metric is the last bucket of the live charts' summary (live.SnapshotBucket, one probe of
# its (run, name, bucket) index per run), progress is the summary's max step over trainer.max_steps,
# wall time the same expression the leaderboard sorts by. Key → the metric (None: computed below).
METRIC_SORT_KEYS: dict[str, str | None] = {
    "heldout": mn.HELDOUT_SUCCESS, "reward": mn.ROLLOUT_REWARD_MEAN, "loss": mn.TRAIN_LOSS, "tokens_per_s": mn.ROLLOUT_TOKENS_PER_S,
    "lag": mn.POLICY_LAG_MAX, "kl": mn.TRAIN_KL, "progress": None, "wall": None,
}
# Sorted largest first when first clicked (a loss, a lag and a KL: smallest first).
METRIC_SORT_DESCENDING_FIRST = ("heldout", "reward", "tokens_per_s", "progress", "wall")
DEFAULT_SORT = "-created"


class BadFilter(ValueError):
    """A filter parameter that cannot be applied; the message names it."""


@dataclass
class RunFilters:
    status: str = ""
    tag: str = ""
    q: str = ""
    owner: str = ""
    archived: str = "0"
    sort: str = DEFAULT_SORT

    @classmethod
    def from_query(cls, query: Mapping[str, Any], *, sort: bool = True) -> RunFilters:
        """The filters of a request's query. `sort=False` for views whose `sort` parameter
        names their own columns (the leaderboard's scores): it is then neither read nor
        checked here, and the runs keep the default order."""

        def text(name: str, limit: int = 120) -> str:
            value = str(query.get(name, "") or "").strip()
            if len(value) > limit:
                raise BadFilter(f"{name}: at most {limit} characters")
            return value

        filters = cls(status=text("status"), tag=text("tag", 40), q=text("q"), owner=text("owner", 150),
                      archived=text("archived") or "0", sort=(text("sort") if sort else "") or DEFAULT_SORT)
        if filters.status and filters.status not in RunStatus.values:
            raise BadFilter(f"status: unknown status {filters.status!r}; use one of {', '.join(RunStatus.values)}")
        if filters.archived not in ("0", "1", "all"):
            raise BadFilter("archived: use 0 (hide archived runs), 1 (only archived) or all")
        if filters.sort.lstrip("-") not in RUN_SORT_KEYS and filters.sort.lstrip("-") not in METRIC_SORT_KEYS:
            raise BadFilter(f"sort: unknown column {filters.sort.lstrip('-')!r}; use one of {', '.join([*RUN_SORT_KEYS, *METRIC_SORT_KEYS])}")
        return filters

    def query_string(self, **changes: str) -> str:
        """The filters as a query string (for links that change one of them, e.g. the sort)."""
        from urllib.parse import urlencode

        values = {"status": self.status, "tag": self.tag, "q": self.q, "owner": self.owner, "archived": self.archived, "sort": self.sort, **changes}
        return urlencode({key: value for key, value in values.items() if value and not (key == "archived" and value == "0") and not (key == "sort" and value == DEFAULT_SORT)})


def filter_runs(runs: QuerySet[Run], filters: RunFilters, user: AbstractBaseUser) -> QuerySet[Run]:
    """`runs` (already limited to what `user` may see) narrowed and ordered by `filters`.
    The owner filter is for staff; for others it can only match their own runs anyway."""
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.tag:
        runs = runs.filter(tags__contains=[filters.tag])
    if filters.q:
        runs = runs.filter(name__icontains=filters.q)
    if filters.owner:
        runs = runs.filter(owner__username=filters.owner)
    if filters.archived == "0":
        runs = runs.filter(archived_at__isnull=True)
    elif filters.archived == "1":
        runs = runs.filter(archived_at__isnull=False)
    key = filters.sort.lstrip("-")
    descending = filters.sort.startswith("-")
    expression = _metric_sort_expression(key) if key in METRIC_SORT_KEYS else F(RUN_SORT_KEYS[key])
    # Empty values (a run not started yet, a metric not logged) sort last in both directions.
    order = expression.desc(nulls_last=True) if descending else expression.asc(nulls_last=True)
    return runs.order_by(order, "-id")


def _metric_sort_expression(key: str) -> RawSQL:
    from inflight.live.models import SnapshotBucket, SnapshotCursor

    run_id = f"{Run._meta.db_table}.id"
    if key == "wall":
        return RawSQL(RUN_WALL_TIME_SQL, [], output_field=FloatField())
    if key == "progress":
        return RawSQL(
            f"(SELECT c.max_step FROM {SnapshotCursor._meta.db_table} c WHERE c.run_id = {run_id})::float"
            f" / NULLIF(({Run._meta.db_table}.config -> 'trainer' ->> 'max_steps')::float, 0)",
            [], output_field=FloatField(),
        )
    return RawSQL(
        f"(SELECT b.last_value FROM {SnapshotBucket._meta.db_table} b WHERE b.run_id = {run_id} AND b.name = %s ORDER BY b.bucket DESC LIMIT 1)",
        [METRIC_SORT_KEYS[key]], output_field=FloatField(),
    )


MAX_TAG_SUGGESTIONS = 1000


def all_tags(runs: QuerySet[Run]) -> list[str]:
    """Every tag used on `runs` (for the filter's suggestions), at most MAX_TAG_SUGGESTIONS.
    Gathered in PostgreSQL: decoding every run's tag list in Python cost ~10 ms per page at
    2,000 runs (bench/platform_scale.py)."""
    try:
        ids_sql, params = runs.order_by().values("pk").query.sql_with_params()
    except EmptyResultSet:  # Run.objects.none(): an anonymous user's runs
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT tag #>> '{{}}' FROM {Run._meta.db_table} r, jsonb_array_elements(CASE WHEN jsonb_typeof(r.tags) = 'array' THEN r.tags ELSE '[]' END) t(tag) "
            f"WHERE r.id IN ({ids_sql}) AND jsonb_typeof(tag) = 'string' LIMIT %s",
            [*params, MAX_TAG_SUGGESTIONS],
        )
        return sorted(tag for (tag,) in cursor.fetchall())
