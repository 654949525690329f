"""Store a bounded sample of a run's rollouts as the worker delivers stream lines.

`ingest_rollouts` is idempotent (unique `(run, line)`) and transactional: if PostgreSQL is
away it raises, the worker's tail does not advance, and the same lines come again later.
Live pushes go after commit to the pages showing the run's Rollouts tab (`run_rollouts_group`):
`{"type": "rollouts.batch", "seq", "rows": [summary, ...], "more": n}` (newest last, at most
PUSH_ROWS; `more`: rows this batch stored that the push leaves out — the page loads its list again).
"""

from __future__ import annotations

import logging
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Sequence

from django.db import connection, transaction

from inflight.live.broadcast import push_on_commit, run_rollouts_group
from inflight.live.ingest import metrics_behind
from inflight.rollouts.models import RolloutStore, StoredRollout
from inflight.rollouts.selectors import summary_json
from inflight.rollouts.tokens import TokenDecoder, problem_text
from inflight.runs.json_rows import model_fields, rows_source, server_bound_cursor
from inflight.runs.writer_thread import WriterThread
from inflight.runs.models import Run
from rl_core.config.monitoring import RolloutStoreConfig

logger = logging.getLogger(__name__)

# A push carries at most this many new rows (a 100x burst must not become a 1 MB message); it
# says how many it left out (`more`), and a page that wants them loads its list again.
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


# Each decoder's token pieces as text, by id: a piece does not depend on its neighbours
# (TokenDecoder.pieces decodes ids one by one), and decoding every token of every kept sample
# again was a tenth of ingest time at 200 live runs (bench/platform_scale.py, py-spy).
_PIECES: weakref.WeakKeyDictionary[TokenDecoder, dict[int, str]] = weakref.WeakKeyDictionary()


def _pieces(decoder: TokenDecoder, ids: list[int]) -> list[str]:
    known = _PIECES.setdefault(decoder, {})
    missing = list({i for i in ids if i not in known})
    if missing:
        known.update(zip(missing, (_text(piece) for piece in decoder.pieces(missing))))
    return [known[i] for i in ids]


def _prompt_texts(decoder: TokenDecoder, prompt_ids: list[int], decoded: dict[tuple[int, ...], tuple[str, str]]) -> tuple[str, str]:
    """(whole prompt, its problem) as text; a group's samples share their prompt, so a batch
    decodes each prompt once (`decoded`: this batch's)."""
    key = tuple(prompt_ids)
    if key not in decoded:
        decoded[key] = (_text(decoder.text(prompt_ids, skip_special=True)), _text(problem_text(decoder, prompt_ids)))
    return decoded[key]


TURN_KINDS = ("model", "tool")


def completion_mask(record: dict[str, Any], length: int) -> list[int] | None:
    """The sample's `completion_mask` (1 = the policy's token, 0 = a tool's output) as stored:
    None when it is absent or all ones (a single-turn sample: nothing to tell apart)."""
    mask = record.get("completion_mask")
    if mask is None:
        return None
    if not isinstance(mask, list) or len(mask) != length:
        raise ValueError("completion_mask differs in length from completion_token_ids")
    values = [1 if int(bit) else 0 for bit in mask]
    return None if all(values) else values


def sample_turns(metadata: dict[str, Any], length: int) -> list[dict[str, Any]] | None:
    """`metadata["turns"]` as the viewer reads it: each turn's kind, its completion-token span
    (clamped to the sample) and, for a tool turn, its status and seconds. None when absent or not
    in the contract's shape: the sample is still shown, token by token, without turns."""
    turns = metadata.get("turns")
    if not isinstance(turns, list) or not turns:
        return None
    out: list[dict[str, Any]] = []
    for turn in turns:
        if not isinstance(turn, dict) or turn.get("kind") not in TURN_KINDS:
            return None
        try:
            start, end = max(0, min(length, int(turn["start"]))), max(0, min(length, int(turn["end"])))
        except (KeyError, TypeError, ValueError):
            return None
        item: dict[str, Any] = {"kind": turn["kind"], "start": start, "end": max(start, end)}
        if turn["kind"] == "tool":
            status = str(turn.get("status") or "")
            # An unknown status is shown as written (an env's own), cut to what a badge holds.
            item["status"] = status[:32]
            try:
                item["seconds"] = None if turn.get("seconds") is None else float(turn["seconds"])
            except (TypeError, ValueError):
                item["seconds"] = None
        out.append(item)
    return out


def placement(line: int, record: dict[str, Any], discarded: bool) -> tuple[int, int | None]:
    """(the stream line a sample is filed under, its `discard_line`): a stream sample's own line; a
    discarded one's `metadata.stream_line` (where the actor would have written it) and its line
    in stream/discarded.jsonl. Raises ValueError/KeyError/TypeError for a malformed record."""
    if not discarded:
        return line, None
    if not str(record.get("discarded") or ""):
        raise ValueError("a line of the discarded file without its reason")
    stream_line = int(record["metadata"]["stream_line"])
    if stream_line < 0:
        raise ValueError("negative stream_line")
    return stream_line, line


def _row(run_id: int, line: int, step: int, seq: int, record: dict[str, Any], decoder: TokenDecoder, now: float,
         decoded: dict[tuple[int, ...], tuple[str, str]] | None = None, discard_line: int | None = None) -> dict[str, Any]:
    """The stored row of a sample, by StoredRollout's attribute names (what `json_rows.rows_source`
    inserts and `summary_json` reads): no model instance is built for it — at 200 live runs
    building one per kept sample was a third of the rows' Python time (bench/platform_scale.py)."""
    ids = [int(i) for i in record["completion_token_ids"]]
    versions = [int(v) for v in record["token_versions"]]
    logprobs = [float(x) for x in record["behaviour_logprobs"]]
    if not (len(ids) == len(versions) == len(logprobs)):
        raise ValueError("completion_token_ids, token_versions and behaviour_logprobs differ in length")
    metadata = record.get("metadata") or {}
    train_logprobs = metadata.get("train_logprobs")
    mask = completion_mask(record, len(ids))
    # Tool tokens carry version -1 (no policy sampled them): a sample's versions and lag are its
    # policy tokens' only.
    policy_versions = versions if mask is None else [v for v, bit in zip(versions, mask) if bit]
    min_version = min(policy_versions, default=0)
    try:
        tool_calls = max(0, int(metadata.get("tool_calls") or 0))
    except (TypeError, ValueError):
        tool_calls = 0
    extracted = metadata.get("extracted")
    prompt, problem = _prompt_texts(decoder, [int(i) for i in record.get("prompt_token_ids") or []], {} if decoded is None else decoded)
    return dict(
        run_id=run_id, line=line, step=step, seq=seq,
        sample_id=str(record.get("sample_id", ""))[:200], group_id=str(record.get("group_id", ""))[:200],
        prompt_id=str(record.get("prompt_id", ""))[:200],
        prompt_text=prompt, problem_text=problem,
        completion_text=_text(decoder.text(ids, skip_special=True)), tokens=_pieces(decoder, ids), token_ids=ids,
        logprobs=logprobs, versions=versions,
        train_logprobs=[float(x) for x in train_logprobs] if isinstance(train_logprobs, list) and len(train_logprobs) == len(ids) else None,
        reward=float(record["reward"]), correct=bool(record["success"]), advantage=float(record.get("advantage", 0.0)),
        completion_mask=mask, turns=sample_turns(metadata, len(ids)), tool_calls=tool_calls, env=_text(str(metadata.get("env") or ""))[:64],
        length=len(ids), min_version=min_version, max_version=max(policy_versions, default=0),
        versions_spanned=len(set(policy_versions)), max_lag=max(0, (step - 1) - min_version),
        extracted="" if extracted is None else _text(str(extracted)[:200]), finish_reason=str(record.get("finish_reason", ""))[:16], t=now,
        # A reason the platform does not know yet (a newer engine's) is shown as written.
        discarded="" if discard_line is None else _text(str(record.get("discarded") or ""))[:32], discard_line=discard_line,
    )


@dataclass
class RolloutIngestState:
    """What one run's supervisor keeps between rollout batches: the run's store settings (read
    once) and the store's stride as last written. The stride only grows (thinning doubles it, and
    only this ingest thins), so a line off the known grid is off the stored one too: a batch with
    no line on it stores nothing and is not sent to the database at all — at the demo's rate four
    batches in five, which cost 35% of ingest at 200 live runs (bench/platform_scale.py, py-spy).
    `RolloutStore.lines_seen` is brought up to date by the next batch that is written, and at
    least every `LINES_SEEN_EVERY_S`."""

    LINES_SEEN_EVERY_S: ClassVar[float] = 10.0

    settings: RolloutStoreConfig
    samples_per_step: int
    stride: int | None = None  # None: the store row was not read yet
    lines_seen: int = 0  # stream lines delivered (written to the store or pending)
    written_at: float = field(default_factory=time.monotonic)

    @classmethod
    def from_config(cls, run_config: dict[str, Any]) -> RolloutIngestState:
        return cls(*store_settings(run_config))

    def lines_wanted(self) -> Callable[[int], bool] | None:
        """Whether a stream line can be stored, by its number alone: on the stride's grid. None
        while the stride is unknown (every line may be). The stride only grows, so a line off
        it now is off it for good: the worker need not even parse it."""
        stride, samples_per_step = self.stride, self.samples_per_step
        if stride is None:
            return None
        return lambda line: step_of_line(line, samples_per_step) % stride == 0

    @classmethod
    def for_run(cls, run_id: int) -> RolloutIngestState:
        config = Run.objects.filter(pk=run_id).values_list("config", flat=True).first()
        if config is None:
            raise Run.DoesNotExist(f"run {run_id} does not exist")
        return cls.from_config(config)


# Creates the run's store on its first batch, takes the next batch seq and counts the lines seen;
# locks the row until commit.
_NEXT_BATCH_SQL = f"""
INSERT INTO {RolloutStore._meta.db_table} AS s (run_id, stride, stored, seq, lines_seen) VALUES (%s, %s, 0, 1, %s)
ON CONFLICT (run_id) DO UPDATE SET seq = s.seq + 1, lines_seen = GREATEST(s.lines_seen, EXCLUDED.lines_seen)
RETURNING stride, stored, seq, lines_seen
"""


def ingest_rollouts(run_id: int, records: Sequence[tuple[int, dict[str, Any]]], decoder: TokenDecoder,
                    state: RolloutIngestState | None = None, discarded: bool = False, lines_read: int | None = None) -> int:
    """Store the kept samples among `records` ((stream line, RolloutSample json) pairs); returns
    how many rows were added. A malformed line is skipped (ValueError/KeyError/TypeError) —
    retrying could not fix it. `state`: the run's `RolloutIngestState` kept by its supervisor
    (read from the run when not given). `discarded`: the records are lines of
    stream/discarded.jsonl (with their line there), kept on the same step grid as the stream's.
    `lines_read`: stream lines read so far, those the worker passed over unparsed
    (`RolloutIngestState.lines_wanted`) included; `records` may then be empty."""
    if not records and not lines_read:
        return 0
    state = state if state is not None else RolloutIngestState.for_run(run_id)
    placed: list[tuple[int, int | None, dict[str, Any]]] = []  # (stream line, discard line, record)
    for line, record in records:
        try:
            placed.append((*placement(line, record, discarded), record))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    lines = [line for line, _, _ in placed]
    # Stream lines seen count the stream only: a discarded sample is not one of its lines.
    seen = state.lines_seen if discarded else max(state.lines_seen, lines_read or 0, max((line for line, _ in records), default=-1) + 1)
    if state.stride is not None and not any(step_of_line(line, state.samples_per_step) % state.stride == 0 for line in lines):
        if time.monotonic() - state.written_at >= state.LINES_SEEN_EVERY_S:
            RolloutStore.objects.filter(run_id=run_id, lines_seen__lt=seen).update(lines_seen=seen)
            state.written_at = time.monotonic()
        state.lines_seen = seen
        return 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_NEXT_BATCH_SQL, [run_id, state.settings.keep_every_n_steps, seen])
            stride, stored, seq, lines_seen = cursor.fetchone()
        store = RolloutStore(run_id=run_id, stride=stride, stored=stored, seq=seq, lines_seen=lines_seen)
        now = time.time()
        rows = []
        decoded: dict[tuple[int, ...], tuple[str, str]] = {}
        for line, discard_line, record in placed:
            step = step_of_line(line, state.samples_per_step)
            if step % store.stride != 0:
                continue
            try:
                rows.append(_row(run_id, line, step, store.seq, record, decoder, now, decoded, discard_line))
            except (ValueError, KeyError, TypeError):
                continue
        if rows:
            # Lines stored before (a batch sent again after an outage) are left out by the insert.
            rows, store.stored = _insert_rows(rows, "discard_line" if discarded else "line")
            if store.stored > state.settings.max_stored:
                _thin(store, state.settings.max_stored)
                RolloutStore.objects.filter(run_id=run_id).update(stride=store.stride, stored=store.stored)
        if rows:
            on_grid = [row for row in rows if row["step"] % store.stride == 0]
            kept = on_grid[-PUSH_ROWS:]
            if kept:
                message = {"type": "rollouts.batch", "run_id": run_id, "seq": store.seq, "rows": [summary_json(row) for row in kept],
                           "more": len(on_grid) - len(kept)}
                push_on_commit(run_rollouts_group(run_id), message)
    # Taken into the state only once committed: after a database error the batch comes again.
    state.stride, state.lines_seen, state.written_at = store.stride, store.lines_seen, time.monotonic()
    return len(rows)


# The kept rows of the rollout viewer were the largest share of each ingest thread's time at 200 live
# runs; storing them filled the two cores of bench/platform_scale.py, and every metric push came
# seconds late (266 ms at p95 without them, 2.4 s with: bench/RESULTS.md, 2026-11-29). They can lag,
# metrics cannot: they wait while this process's metrics are behind (one write every 3 s at least).
_writer: WriterThread[int] = WriterThread("inflight-rollout-writer", defer_while=metrics_behind)


def submit_rollouts(run_id: int, records: Sequence[tuple[int, dict[str, Any]]], decoder: TokenDecoder, state: RolloutIngestState,
                    discarded: bool = False, lines_read: int | None = None) -> Future[int]:
    """`ingest_rollouts` on this process's rollout writer (`runs.writer_thread`); the future's result is its count (or
    its error: the caller sends the lines again). `state` is the writer's until the future is done."""
    return _writer.submit(lambda: ingest_rollouts(run_id, records, decoder, state, discarded, lines_read))


_INSERT_CHUNK_ROWS = 1000  # rows per statement: bounds the JSON document one statement carries


def _insert_rows(rows: list[dict[str, Any]], key: str = "line") -> tuple[list[dict[str, Any]], int]:
    """Insert the rows (`_row`'s mappings) whose `key` (`line`, or `discard_line` for discarded
    samples) is not stored yet, count them in their store's `stored` in the same statement, and
    set their `id`s; returns (the rows inserted, the store's new `stored`).
    The rows travel as one JSON document (`runs.json_rows`: the token arrays were most of ingest's
    CPU); a row JSON cannot carry (a NaN logprob) is bound value by value."""
    fields = model_fields(StoredRollout)
    run_id = rows[0]["run_id"]
    inserted: list[dict[str, Any]] = []
    stored = 0
    with server_bound_cursor() as cursor:
        for start in range(0, len(rows), _INSERT_CHUNK_ROWS):
            chunk = {row[key]: row for row in rows[start:start + _INSERT_CHUNK_ROWS]}
            columns, source, params = rows_source(list(chunk.values()), fields)
            cursor.execute(_insert_and_count_sql(columns, source, key), [*params, run_id])
            for pk, line, stored in cursor.fetchall():
                if pk is None:
                    continue  # no row was new: the joined row only carries `stored`
                row = chunk[line]
                row["id"] = pk
                inserted.append(row)
    inserted.sort(key=lambda row: (row["line"], row["discard_line"] or 0))
    return inserted, stored


# Each key's unique index is partial (models.StoredRollout.Meta): the conflict target names its predicate.
_CONFLICT_TARGETS = {
    "line": "(run_id, line) WHERE discard_line IS NULL",
    "discard_line": "(run_id, discard_line) WHERE discard_line IS NOT NULL",
}


def _insert_and_count_sql(columns: str, source: str, key: str = "line") -> str:
    return (
        f"WITH new AS (INSERT INTO {StoredRollout._meta.db_table} ({columns}) {source} "
        f"ON CONFLICT {_CONFLICT_TARGETS[key]} DO NOTHING RETURNING id, {key}), "
        f"counted AS (UPDATE {RolloutStore._meta.db_table} SET stored = stored + (SELECT count(*) FROM new) "
        "WHERE run_id = %s RETURNING stored) "
        f"SELECT new.id, new.{key}, (SELECT stored FROM counted) FROM new RIGHT JOIN (SELECT 1) AS one ON true"
    )


def attach_train_logprobs(run_id: int, records: Sequence[dict[str, Any]]) -> int:
    """Set the trainer's per-token logprobs (lines of train_logprobs.jsonl) on the stored rows of
    the same samples; returns how many rows changed. Idempotent (a re-sent batch writes the same
    values); a line for a sample the store did not keep, or of the wrong length, is ignored. A line
    with `discarded` (the trainer dropped the sample: `stale`) marks the stream sample's row instead."""
    by_sample: dict[str, list[float]] = {}
    dropped: dict[str, list[str]] = {}  # reason -> sample ids
    for record in records:
        values = record.get("logprobs") if isinstance(record, dict) else None
        sample_id = record.get("sample_id") if isinstance(record, dict) else None
        reason = record.get("discarded") if isinstance(record, dict) else None
        if isinstance(sample_id, str) and isinstance(reason, str) and reason:
            dropped.setdefault(_text(reason)[:32], []).append(sample_id[:200])
            continue
        if not isinstance(sample_id, str) or not isinstance(values, list):
            continue
        try:
            by_sample[sample_id[:200]] = [float(value) for value in values]
        except (TypeError, ValueError):
            continue
    marked = 0
    for reason, sample_ids in dropped.items():
        # The stream's rows only: an actor's discarded sample never reached the trainer.
        marked += StoredRollout.objects.filter(run_id=run_id, sample_id__in=sample_ids, discard_line__isnull=True).exclude(
            discarded=reason).update(discarded=reason)
    if not by_sample:
        return marked
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
    return marked + len(changed)


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
