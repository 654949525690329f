"""Store a bounded sample of a run's rollouts as the worker delivers stream lines.

`ingest_rollouts` is idempotent (unique `(run, line)`) and transactional: if PostgreSQL is
away it raises, the worker's tail does not advance, and the same lines come again later.
Live pushes go to the run's group after commit:
`{"type": "rollouts.batch", "seq", "rows": [summary, ...]}` (newest last, at most PUSH_ROWS).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from django.db import connection, transaction

from inflight.live.broadcast import _group_send, run_group
from inflight.rollouts.models import RolloutStore, StoredRollout
from inflight.rollouts.selectors import summary_json
from inflight.rollouts.tokens import TokenDecoder, problem_text
from inflight.runs.models import Run
from rl_core.config import RolloutStoreConfig

# A push carries at most this many new rows (a 100x burst must not become a 1 MB message);
# a client that wants the rest pages the API.
PUSH_ROWS = 100
# Thinning doubles the stride at most this many times per batch (a guard, not a limit hit in practice).
MAX_DOUBLINGS = 40


def store_settings(run_config: dict[str, Any]) -> tuple[RolloutStoreConfig, int]:
    """(rollout store settings, samples per trainer step) of a stored run config."""
    section = ((run_config or {}).get("monitoring") or {}).get("rollouts") or {}
    samples_per_step = int(((run_config or {}).get("trainer") or {}).get("samples_per_step") or 1)
    return RolloutStoreConfig.model_validate(section), max(1, samples_per_step)


def step_of_line(line: int, samples_per_step: int) -> int:
    """The trainer reads the stream in order, `samples_per_step` at a time: line i is trained at
    step i // samples_per_step + 1 (exact unless the trainer dropped stale samples before it)."""
    return line // samples_per_step + 1


def _text(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and a byte-level token may decode to one: show it as �.
    return value.replace("\x00", "\ufffd")


def _row(run_id: int, line: int, step: int, seq: int, record: dict[str, Any], decoder: TokenDecoder, now: float) -> StoredRollout:
    ids = [int(i) for i in record["completion_token_ids"]]
    versions = [int(v) for v in record["token_versions"]]
    logprobs = [float(x) for x in record["behaviour_logprobs"]]
    if not (len(ids) == len(versions) == len(logprobs)):
        raise ValueError("completion_token_ids, token_versions and behaviour_logprobs differ in length")
    metadata = record.get("metadata") or {}
    train_logprobs = metadata.get("train_logprobs")
    min_version = min(versions, default=0)
    extracted = metadata.get("extracted")
    return StoredRollout(
        run_id=run_id, line=line, step=step, seq=seq,
        sample_id=str(record.get("sample_id", ""))[:200], group_id=str(record.get("group_id", ""))[:200],
        prompt_id=str(record.get("prompt_id", ""))[:200],
        prompt_text=_text(decoder.text(record.get("prompt_token_ids") or [], skip_special=True)),
        problem_text=_text(problem_text(decoder, record.get("prompt_token_ids") or [])),
        completion_text=_text(decoder.text(ids, skip_special=True)), tokens=[_text(piece) for piece in decoder.pieces(ids)], token_ids=ids,
        logprobs=logprobs, versions=versions,
        train_logprobs=[float(x) for x in train_logprobs] if isinstance(train_logprobs, list) and len(train_logprobs) == len(ids) else None,
        reward=float(record["reward"]), correct=bool(record["success"]), advantage=float(record.get("advantage", 0.0)),
        length=len(ids), min_version=min_version, max_version=max(versions, default=0),
        versions_spanned=len(set(versions)), max_lag=max(0, (step - 1) - min_version),
        extracted="" if extracted is None else _text(str(extracted)[:200]), finish_reason=str(record.get("finish_reason", ""))[:16], t=now,
    )


def ingest_rollouts(run_id: int, records: Sequence[tuple[int, dict[str, Any]]], decoder: TokenDecoder) -> int:
    """Store the kept samples among `records` ((stream line, RolloutSample json) pairs); returns
    how many rows were added. A malformed line is skipped (ValueError/KeyError/TypeError) —
    retrying could not fix it."""
    if not records:
        return 0
    with transaction.atomic():
        config = Run.objects.filter(pk=run_id).values_list("config", flat=True).first()
        if config is None:
            raise Run.DoesNotExist(f"run {run_id} does not exist")
        settings_, samples_per_step = store_settings(config)
        RolloutStore.objects.get_or_create(run_id=run_id, defaults={"stride": settings_.keep_every_n_steps})
        store = RolloutStore.objects.select_for_update().get(run_id=run_id)
        lines = [line for line, _ in records]
        known = set(
            StoredRollout.objects.filter(run_id=run_id, line__gte=min(lines), line__lte=max(lines)).values_list("line", flat=True)
        )
        store.seq += 1
        now = time.time()
        rows = []
        for line, record in records:
            step = step_of_line(line, samples_per_step)
            if line in known or step % store.stride != 0:
                continue
            try:
                rows.append(_row(run_id, line, step, store.seq, record, decoder, now))
            except (ValueError, KeyError, TypeError):
                continue
        store.lines_seen = max(store.lines_seen, max(lines) + 1)
        if rows:
            StoredRollout.objects.bulk_create(rows)
            store.stored += len(rows)
            _thin(store, settings_.max_stored)
        store.save()
        if rows:
            kept = [row for row in rows if row.step % store.stride == 0][-PUSH_ROWS:]
            if kept:
                message = {"type": "rollouts.batch", "run_id": run_id, "seq": store.seq, "rows": [summary_json(row) for row in kept]}
                transaction.on_commit(lambda: _group_send(run_group(run_id), message))
    return len(rows)


def attach_train_logprobs(run_id: int, records: Sequence[dict[str, Any]]) -> int:
    """Set the trainer's per-token logprobs (lines of train_logprobs.jsonl) on the stored rows of
    the same samples; returns how many rows changed. Idempotent (a re-sent batch writes the same
    values); a line for a sample the store did not keep, or of the wrong length, is ignored."""
    by_sample: dict[str, list[float]] = {}
    for record in records:
        values = record.get("logprobs") if isinstance(record, dict) else None
        sample_id = record.get("sample_id") if isinstance(record, dict) else None
        if not isinstance(sample_id, str) or not isinstance(values, list):
            continue
        try:
            by_sample[sample_id[:200]] = [float(value) for value in values]
        except (TypeError, ValueError):
            continue
    if not by_sample:
        return 0
    with transaction.atomic():
        rows = list(
            StoredRollout.objects.filter(run_id=run_id, sample_id__in=list(by_sample)).only("pk", "sample_id", "length")
        )
        changed = []
        for row in rows:
            values = by_sample[row.sample_id]
            if len(values) == row.length:
                row.train_logprobs = values
                changed.append(row)
        if changed:
            StoredRollout.objects.bulk_update(changed, ["train_logprobs"], batch_size=500)
    return len(changed)


def _thin(store: RolloutStore, max_stored: int) -> None:
    """Double the stride until at most `max_stored` rows remain (rows off the new grid are
    deleted), so a long run's rows stay evenly spread over all its steps."""
    table = StoredRollout._meta.db_table
    doublings = 0
    with connection.cursor() as cursor:
        while store.stored > max_stored and doublings < MAX_DOUBLINGS:
            store.stride *= 2
            doublings += 1
            cursor.execute(f"DELETE FROM {table} WHERE run_id = %s AND step %% %s <> 0", [store.run_id, store.stride])
            store.stored -= cursor.rowcount
