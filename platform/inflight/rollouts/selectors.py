"""Reads of stored rollouts. Callers pass a run the user may see (`runs.selectors.get_run_for_user`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from django.db.models import Count, F, QuerySet

from inflight.rollouts.models import StoredRollout
from inflight.runs.models import Run
from rl_core.envs.advantages import carries_gradient
from rl_core.config.run_config import RunConfig

SHORT_CHARS = 120
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def _short(text: str, limit: int = SHORT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary_json(row: StoredRollout | Mapping[str, Any]) -> dict[str, Any]:
    """One table row (what the list API, the page and the live push carry): of a stored row, or of
    the mapping ingest has just inserted (StoredRollout's attribute names, its `id` set)."""
    get: Any = row.__getitem__ if isinstance(row, Mapping) else (lambda name: row.pk if name == "id" else getattr(row, name))
    return {
        "id": get("id"), "line": get("line"), "step": get("step"), "sample_id": get("sample_id"), "group_id": get("group_id"),
        "prompt": _short(get("problem_text") or get("prompt_text")), "response": _short(get("completion_text")), "reward": get("reward"),
        "correct": get("correct"), "length": get("length"), "versions_spanned": get("versions_spanned"),
        "min_version": get("min_version"), "max_version": get("max_version"), "max_lag": get("max_lag"),
        "extracted": get("extracted"), "tool_calls": get("tool_calls"), "env": get("env"),
        "discarded": get("discarded") or None,
    }


# Why a sample has no importance ratios (the viewer shows it): the trainer computes only samples
# with a gradient (rl_core.envs.advantages.carries_gradient).
NO_RATIOS_ZERO_ADVANTAGE = "advantage 0: no gradient, so the trainer did not compute this sample"
NO_RATIOS_DISCARDED = "discarded ({reason}): never trained, so no trainer logprobs"
NO_RATIOS_YET = "no trainer logprobs for this sample (not trained yet, or the run does not record them)"


def trainer_kl_coef(run: Run) -> float:
    """The run's KL coefficient (with it, zero-advantage samples are trained too)."""
    return RunConfig.model_validate(run.config).trainer.kl_coef


def detail_json(row: StoredRollout, kl_coef: float) -> dict[str, Any]:
    """The whole sample: text, and per token its text, version and behaviour logprob; the
    importance ratio exp(train - behaviour) where the trainer's logprobs were recorded, else
    `ratios_missing` says why (`kl_coef`: the run's, `trainer_kl_coef`)."""
    mask = row.completion_mask if row.completion_mask is not None else [1] * len(row.versions)
    ratios: list[float | None] | None = None
    if row.train_logprobs is not None:
        import math

        # A tool's output is context, never trained: it has no behaviour policy, so no ratio.
        ratios = [math.exp(min(50.0, t - b)) if bit else None for t, b, bit in zip(row.train_logprobs, row.logprobs, mask)]
    missing = None
    if ratios is None and row.discarded:
        missing = NO_RATIOS_DISCARDED.format(reason=row.discarded)
    elif ratios is None:
        missing = NO_RATIOS_YET if carries_gradient(row.advantage, kl_coef) else NO_RATIOS_ZERO_ADVANTAGE
    switches = version_switches(row.versions, mask)
    return {
        **summary_json(row), "prompt_id": row.prompt_id, "prompt_text": row.prompt_text,
        "completion_text": row.completion_text, "advantage": row.advantage, "finish_reason": row.finish_reason,
        "tokens": row.tokens, "token_ids": row.token_ids, "versions": row.versions, "logprobs": row.logprobs,
        "train_logprobs": row.train_logprobs, "ratios": ratios, "ratios_missing": missing, "version_switches": switches,
        "completion_mask": row.completion_mask, "turns": turns_json(row.turns, row.versions, mask),
    }


def version_switches(versions: list[int], mask: list[int]) -> list[int]:
    """Token indices where the policy version changes, counting the policy's tokens only: a tool's
    output (mask 0, version -1) sits between two model turns, and an update that landed while the
    tool ran shows at the next turn's first token."""
    switches, previous = [], None
    for index, (version, bit) in enumerate(zip(versions, mask)):
        if not bit:
            continue
        if previous is not None and version != previous:
            switches.append(index)
        previous = version
    return switches


def turns_json(turns: list[dict[str, Any]] | None, versions: list[int], mask: list[int]) -> list[dict[str, Any]] | None:
    """The stored turns with what the viewer says of each: a model turn's policy versions (in
    order) and `updated_before` ({from, to}) when the weights changed since the previous model
    turn's last token (an update landed between the turns, e.g. while the tool ran); a tool turn
    as stored (status, seconds). None for a single-turn sample."""
    if not turns:
        return None
    out, last_version = [], None
    for turn in turns:
        item = dict(turn)
        if turn["kind"] == "model":
            own = [versions[i] for i in range(turn["start"], turn["end"]) if mask[i]]
            seen: list[int] = []
            for version in own:
                if version not in seen:
                    seen.append(version)
            item["versions"] = seen
            item["updated_before"] = (
                {"from": last_version, "to": own[0]} if own and last_version is not None and own[0] != last_version else None
            )
            if own:
                last_version = own[-1]
        out.append(item)
    return out


@dataclass
class RolloutFilter:
    step_min: int | None = None
    step_max: int | None = None
    correct: bool | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    length_min: int | None = None
    length_max: int | None = None
    # Trained or not: None every row, TRAINED the trained ones, DISCARDED_ANY every discarded one,
    # else one discard reason.
    discarded: str | None = None
    cursor: int | None = None  # rows with line < cursor (the previous page's `next_cursor`)
    limit: int = PAGE_SIZE


TRAINED = "false"  # RolloutFilter.discarded: trained rows only
DISCARDED_ANY = "true"  # RolloutFilter.discarded: every discarded row
_HEAVY = ("tokens", "token_ids", "logprobs", "versions", "train_logprobs")


def _filtered(run: Run, flt: RolloutFilter) -> QuerySet[StoredRollout]:
    """The run's rows under every filter but the trained/discarded one and the cursor."""
    rows: QuerySet[StoredRollout] = StoredRollout.objects.filter(run_id=run.pk)
    for lookup, value in (
        ("step__gte", flt.step_min), ("step__lte", flt.step_max), ("correct", flt.correct),
        ("reward__gte", flt.reward_min), ("reward__lte", flt.reward_max),
        ("length__gte", flt.length_min), ("length__lte", flt.length_max),
    ):
        if value is not None:
            rows = rows.filter(**{lookup: value})
    return rows


def discard_counts(rows: QuerySet[StoredRollout]) -> dict[str, int]:
    """Rows per kind: `trained` and one key per discard reason present."""
    counts = {"trained": 0}
    for reason, count in rows.order_by().values_list("discarded").annotate(n=Count("id")):
        counts["trained" if not reason else reason] = count
    return counts


def rollout_counts(run: Run, flt: RolloutFilter) -> dict[str, Any]:
    """The first page's `counts` alone (the rows under every filter but trained/discarded, per
    kind): what the open Rollouts tab asks again as new rows arrive, without a page of rows."""
    return {"run": run.pk, "counts": discard_counts(_filtered(run, flt))}


def rollouts_page(run: Run, flt: RolloutFilter) -> dict[str, Any]:
    """Newest first (by stream line; a discarded sample sits at the line it would have had, after
    the trained one there); `next_cursor` is null on the last page. The first page (no cursor)
    also counts the rows per kind (`counts`: trained, and per discard reason) under the other filters."""
    matching = _filtered(run, flt)
    counts = discard_counts(matching) if flt.cursor is None else None
    rows = matching
    if flt.discarded == TRAINED:
        rows = rows.filter(discarded="")
    elif flt.discarded == DISCARDED_ANY:
        rows = rows.exclude(discarded="")
    elif flt.discarded is not None:
        rows = rows.filter(discarded=flt.discarded)
    ordered = rows.order_by("-line", F("discard_line").desc(nulls_first=True)).defer(*_HEAVY)
    page = list((ordered.filter(line__lt=flt.cursor) if flt.cursor is not None else ordered)[: flt.limit + 1])
    more = len(page) > flt.limit
    page = page[: flt.limit]
    if more and page:
        # Discarded samples share a line with each other and the trained one: a page never splits
        # a line, since the next one starts below it.
        page += list(ordered.filter(line=page[-1].line).exclude(pk__in=[row.pk for row in page]))
    return {
        "run": run.pk,
        "rollouts": [summary_json(row) for row in page],
        "next_cursor": page[-1].line if more and page else None,
        "counts": counts,
    }


def rollout_detail(run: Run, rollout_id: int) -> StoredRollout:
    return StoredRollout.objects.get(run_id=run.pk, pk=rollout_id)


def group_json(run: Run, row: StoredRollout) -> dict[str, Any]:
    siblings = StoredRollout.objects.filter(run_id=run.pk, group_id=row.group_id).order_by("line", F("discard_line").asc(nulls_first=True)).defer(*_HEAVY)
    return {
        "run": run.pk, "group_id": row.group_id, "prompt_text": row.prompt_text, "step": row.step,
        "samples": [{**summary_json(s), "advantage": s.advantage} for s in siblings],
    }
