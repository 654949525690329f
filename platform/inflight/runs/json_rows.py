"""Many rows into PostgreSQL as one JSON document, under one unchanging statement.

Django's bulk_create inlines every parameter as an SQL literal (its cursors bind on the client),
quoting each element of array and JSON columns in Python; a statement with one placeholder per
value is no better, as its text changes with the number of rows, so psycopg parses each one anew
and dumps each list element by element. At 200 live runs that was most of an ingest process's
CPU (bench/platform_scale.py, py-spy: rollout rows 58%, an evaluation's per-problem rows in
bursts). orjson writes the document (the json module formats every float through a Python
function: a fifth of an ingest process's time went to it and to reading the lines, py-spy --gil,
2026-11-29) and `json_to_recordset` unpacks it on the server.
"""

from __future__ import annotations

import functools
import math
import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import orjson
import psycopg
from django.contrib.postgres.fields import ArrayField
from django.db import connection, models


# PostgreSQL's text and jsonb cannot hold U+0000, which a model can sample (an untrained one does):
# refused, one evaluation or rollout batch would be retried for ever and hold up the run's
# delivery. It is stored as the replacement character instead.
NUL_STAND_IN = "\ufffd"
# `\u0000` in the JSON text: an escape only after an even number of backslashes.
_JSON_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _json_without_nul(text: str) -> str:
    return _JSON_NUL_ESCAPE.sub(lambda match: match.group(1) + "\\ufffd", text) if "\\u0000" in text else text


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", NUL_STAND_IN)
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {key: _without_nul(item) for key, item in value.items()}
    return value


def model_fields(model: type[models.Model]) -> tuple[models.Field, ...]:
    """The columns an insert writes: every concrete field but the primary key."""
    return tuple(f for f in model._meta.concrete_fields if not f.primary_key)


def rows_source(rows: Sequence[models.Model | Mapping[str, Any]], fields: tuple[models.Field, ...]) -> tuple[str, str, list[Any]]:
    """(the column list, the rows as an INSERT's source, its parameters). A row is a model
    instance or a mapping of every field's attribute name to its value (no instance to build: an
    evaluation's 64 rows at a time, 200 runs evaluating, made instances a tenth of ingest's CPU).
    The source is `SELECT ... FROM json_to_recordset(%s::json)` over one JSON array of objects
    (a JSONField's value goes in as the JSON it is); when a value has no JSON form (NaN, infinity)
    it is `VALUES (...), ...` with every value bound on its own as its field prepares it, typed as
    its column. A NUL character in any text becomes `NUL_STAND_IN` on both ways."""
    columns, select = _select_from_document(fields)
    values = [row if isinstance(row, Mapping) else {f.attname: getattr(row, f.attname) for f in fields} for row in rows]
    if _json_can_carry(values, fields):
        # Mappings keyed as the columns are written as they are (a key of no field is ignored by
        # json_to_recordset): copying each row into a new dict was a tenth of the kept rollouts' time.
        objects = rows if _columns_are_attnames(fields) and all(isinstance(row, Mapping) for row in rows) else [
            {f.column: row[f.attname] for f in fields} for row in values]
        document = orjson.dumps(objects).decode()
        return columns, select, [_json_without_nul(document)]
    one_row = "(" + ", ".join(f"%s::{f.db_type(connection)}" for f in fields) + ")"
    params = [f.get_db_prep_save(_without_nul(row[f.attname]), connection) for row in values for f in fields]
    return columns, "VALUES " + ", ".join([one_row] * len(rows)), params


def _json_can_carry(rows: list[Mapping[str, Any]], fields: tuple[models.Field, ...]) -> bool:
    """No float among the rows' values is NaN or infinite (orjson would write them as null, where
    the VALUES form stores them as they are)."""
    scalars, arrays, documents = _float_attnames(fields)
    for row in rows:
        for name in scalars:
            value = row[name]
            if value is not None and not math.isfinite(value):
                return False
        for name in arrays:
            values = row[name]
            if values and not _finite_sum(values):
                return False
        for name in documents:
            if not _finite_document(row[name]):
                return False
    return True


def _finite_sum(values: list[float | None]) -> bool:
    """One sum in C: a NaN or an infinity among `values` makes it non-finite (so may an overflow of
    huge values: then the VALUES form, still correct)."""
    try:
        return math.isfinite(sum(values))  # type: ignore[arg-type]
    except TypeError:  # a null element
        return math.isfinite(sum(value for value in values if value is not None))


def _finite_document(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite_document(item) for item in value)
    if isinstance(value, dict):
        return all(_finite_document(item) for item in value.values())
    return True


@functools.cache
def _float_attnames(fields: tuple[models.Field, ...]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(float columns, float array columns, JSON columns) among `fields`, by attribute name."""
    scalars = tuple(f.attname for f in fields if isinstance(f, models.FloatField))
    arrays = tuple(f.attname for f in fields if isinstance(f, ArrayField) and isinstance(f.base_field, models.FloatField))
    documents = tuple(f.attname for f in fields if isinstance(f, models.JSONField))
    return scalars, arrays, documents


@functools.cache
def _columns_are_attnames(fields: tuple[models.Field, ...]) -> bool:
    return all(f.column == f.attname for f in fields)


@functools.cache
def _select_from_document(fields: tuple[models.Field, ...]) -> tuple[str, str]:
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    record_type = ", ".join(f"{connection.ops.quote_name(f.column)} {f.db_type(connection)}" for f in fields)
    # json, not jsonb: jsonb would first convert every number to numeric (and each array column then
    # back through text), a sixth of PostgreSQL's time per kept rollout row; json is read once, as
    # text, straight into the columns (a probe of 64 recorded rows: 38 -> 32 µs per row inserted).
    return columns, f"SELECT {columns} FROM json_to_recordset(%s::json) AS r({record_type})"


@contextmanager
def server_bound_cursor() -> Iterator[psycopg.Cursor]:
    """A psycopg cursor on Django's connection (its transaction, its error translation) that binds
    parameters on the server, unlike Django's own cursors."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield cursor
