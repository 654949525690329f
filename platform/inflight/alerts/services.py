"""Evaluate the rules on ingest, store alerts once per episode, push them live, POST webhooks.

Called by the worker's reporter after the data itself was stored: `evaluate_metric_lines`
after each metrics batch, `evaluate_eval` after each evaluation, `check_stalled` on each poll
without new metrics. Pushes to the run's group after commit:
`{"type": "alert.fired", "alert": {...}}`; the same goes to the owner's run-list group.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from django.conf import settings
from django.db import transaction

from inflight.alerts.models import Alert, AlertCursor, AlertEpisode, AlertWebhook
from inflight.alerts.rules import RULES, Firing, Verdicts, advance_episodes, check_eval, check_line, check_stall, eval_drop_watches
from inflight.live.broadcast import push, run_group, user_runs_group
from inflight.runs.models import EvalScore, Run
from rl_core.config.monitoring import AlertsConfig

logger = logging.getLogger(__name__)
WEBHOOK_TIMEOUT_S = 5.0


def alert_json(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.pk, "run": alert.run_id, "rule": alert.rule, "title": RULES.get(alert.rule, alert.rule), "key": alert.key,
        "step": alert.step, "t": alert.t, "message": alert.message, "values": alert.values,
    }


def _settings(run_config: dict[str, Any]) -> tuple[AlertsConfig, int]:
    section = ((run_config or {}).get("monitoring") or {}).get("alerts") or {}
    max_lag = int(((run_config or {}).get("actor") or {}).get("max_lag", 1))
    return AlertsConfig.model_validate(section), max_lag


def _apply(run: Run, verdicts: Verdicts, step: int | None, active: set[tuple[str, str]] | None = None) -> list[Alert]:
    """Start episodes for firing conditions not already active; end the cleared ones.

    `active`: the run's active (rule, key) episodes, when the caller read them under the run's
    alert cursor lock (evaluate_metric_lines); kept up to date here. A cleared condition with no
    active episode then costs no UPDATE: every metrics line clears every quiet rule, and those
    UPDATEs were a quarter of ingest time at 200 live runs (bench/platform_scale.py)."""
    fired = []
    for (rule, key), firing in verdicts.firing.items():
        if active is not None and (rule, key) in active:
            continue
        episode, _ = AlertEpisode.objects.get_or_create(run_id=run.pk, rule=rule, key=key)
        if active is not None:
            active.add((rule, key))
        if episode.active:
            continue
        episode.active = True
        episode.save(update_fields=["active"])
        fired.append(_store(run, rule, key, step, firing))
    cleared = [pair for pair in verdicts.clear if pair not in verdicts.firing]
    for rule, key in cleared:
        if active is not None:
            if (rule, key) not in active:
                continue
            active.discard((rule, key))
        AlertEpisode.objects.filter(run_id=run.pk, rule=rule, key=key, active=True).update(active=False)
    return fired


def _store(run: Run, rule: str, key: str, step: int | None, firing: Firing) -> Alert:
    alert = Alert.objects.create(run_id=run.pk, rule=rule, key=key, step=step, t=time.time(), message=firing.message, values=firing.values)
    payload = alert_json(alert)
    owner_id, run_name = run.owner_id, run.name
    transaction.on_commit(lambda: _announce(payload, owner_id, run_name))
    return alert


def evaluate_metric_lines(run_id: int, records: Sequence[tuple[int, dict[str, Any]]], state: AlertState | None = None) -> list[Alert]:
    """Evaluate metrics.jsonl lines (line number, record) not evaluated before, in order.

    `state`: the run's rule state kept by its supervisor between batches (`load_alert_state`).
    With it, lines that start and end no episode touch no table (the common case: at 200 live
    runs, reading the cursor, episodes and run for every line was a quarter of ingest time,
    bench/platform_scale.py); the cursor is written with every episode change and at least every
    `AlertState.SAVE_EVERY_S`. Without it, the state is read and written back (one transaction)."""
    if not records:
        return []
    if state is None:
        with transaction.atomic():
            state = load_alert_state(run_id, lock=True)
            fired = _evaluate(state, records, force_save=True)
        return fired
    return _evaluate(state, records)


@dataclass
class AlertState:
    """One run's alert rule state as its supervisor holds it between batches: the config's
    thresholds, the cursor (`next_line`, `windows`: what `AlertCursor` stores) and the run's active
    episodes. Only this supervisor writes them while the run runs (one supervisor per run), so
    memory stays equal to the database once each change is written; after a worker restart the
    lines after the stored cursor are evaluated again from the stored windows, which yields the
    same verdicts (no episode changed after a stored cursor), so no alert fires twice."""

    SAVE_EVERY_S: ClassVar[float] = 30.0

    run_id: int
    enabled: bool
    cfg: AlertsConfig
    max_lag: int
    next_line: int
    windows: dict[str, Any]
    active: set[tuple[str, str]]
    saved_line: int
    saved_at: float = field(default_factory=time.monotonic)


def load_alert_state(run_id: int, *, lock: bool = False) -> AlertState:
    """Read a run's rule state (creating its cursor); `lock`: hold the cursor row until commit."""
    config = Run.objects.filter(pk=run_id).values_list("config", flat=True).first()
    if config is None:
        raise Run.DoesNotExist(f"run {run_id} does not exist")
    cfg, max_lag = _settings(config)
    if not cfg.enabled:  # nothing is evaluated, so nothing is stored
        return AlertState(run_id, False, cfg, max_lag, 0, {}, set(), 0)
    AlertCursor.objects.get_or_create(run_id=run_id)
    cursors = AlertCursor.objects.select_for_update() if lock else AlertCursor.objects
    cursor = cursors.get(run_id=run_id)
    active = set(AlertEpisode.objects.filter(run_id=run_id, active=True).values_list("rule", "key"))
    return AlertState(run_id, cfg.enabled, cfg, max_lag, cursor.next_line, cursor.windows, active, cursor.next_line)


def _evaluate(state: AlertState, records: Sequence[tuple[int, dict[str, Any]]], force_save: bool = False) -> list[Alert]:
    """Evaluate on copies; write the episodes and cursor only when an episode starts or ends (or
    the cursor is due), and take the copies into `state` only once that write succeeded (a
    database error leaves `state` as it was: the supervisor re-sends the batch)."""
    if not state.enabled:
        return []
    windows = copy.deepcopy(state.windows)
    next_line = state.next_line
    simulated = set(state.active)
    evaluated: list[tuple[Verdicts, int | None]] = []
    changes = False
    for line, record in sorted(records, key=lambda item: item[0]):
        if line < next_line:
            continue  # a re-sent line: already evaluated
        verdicts = check_line(record, state.cfg, state.max_lag, windows)
        evaluated.append((verdicts, _step(record)))
        next_line = line + 1
        started, ended = advance_episodes(simulated, verdicts)
        changes = changes or bool(started or ended)
    due = next_line != state.saved_line and time.monotonic() - state.saved_at >= state.SAVE_EVERY_S
    fired: list[Alert] = []
    if changes or due or (force_save and next_line != state.saved_line):
        with transaction.atomic(savepoint=not force_save):  # force_save: inside evaluate_metric_lines' own transaction
            active = set(state.active)
            if changes:
                run = Run.objects.only("id", "owner_id", "name").get(pk=state.run_id)
                for verdicts, step in evaluated:
                    fired += _apply(run, verdicts, step, active)
            AlertCursor.objects.filter(run_id=state.run_id).update(next_line=next_line, windows=windows)
        state.active = active
        state.saved_line, state.saved_at = next_line, time.monotonic()
    else:
        state.active = simulated
    state.windows, state.next_line = windows, next_line
    return fired


def _step(record: dict[str, Any]) -> int | None:
    try:
        return int(record.get("step"))
    except (TypeError, ValueError):
        return None


def evaluate_eval(run_id: int, score: EvalScore) -> list[Alert]:
    """`eval_drop` (`rules.check_eval`): this evaluation's mean@k against the benchmark's best
    earlier score. A benchmark the rule does not judge (the held-out set) costs no query."""
    if not eval_drop_watches(score.benchmark):
        return []
    with transaction.atomic():
        run = Run.objects.only("id", "owner_id", "name", "config").get(pk=run_id)
        cfg, _ = _settings(run.config)
        if not cfg.enabled:
            return []
        earlier = EvalScore.objects.filter(run_id=run_id, benchmark=score.benchmark, step__lt=score.step)
        best = max((s.mean_at_k for s in earlier), default=None)
        return _apply(run, check_eval(score.benchmark, score.step, score.k, score.mean_at_k, best, cfg), score.step)


def check_stalled(run_id: int, idle_s: float, last_step: int | None) -> list[Alert]:
    """`stalled`: the run is running and logged no metric for `stall_s` seconds; `idle_s` = 0
    (metrics arrived) ends the episode."""
    with transaction.atomic():
        run = Run.objects.only("id", "owner_id", "name", "config", "status").get(pk=run_id)
        cfg, _ = _settings(run.config)
        if not cfg.enabled:
            return []
        return _apply(run, check_stall(idle_s, run.status == "running", cfg), last_step)


# ---------------------------------------------------------------- delivery


def _announce(payload: dict[str, Any], owner_id: int, run_name: str) -> None:
    message = {"type": "alert.fired", "alert": payload}
    push(run_group(payload["run"]), message)
    push(user_runs_group(owner_id), message)
    if not settings.INFLIGHT_ALERT_WEBHOOKS:
        return
    hook = AlertWebhook.objects.filter(user_id=owner_id, enabled=True).first()
    if hook is not None:
        # Off the ingest path: a slow or dead receiver must not hold up the run's metrics.
        threading.Thread(target=post_webhook, args=(hook.url, payload, run_name), name="alert-webhook", daemon=True).start()


def webhook_body(payload: dict[str, Any], run_name: str) -> dict[str, Any]:
    """Slack-compatible (`text`); the structured alert rides along under `inflight`."""
    step = f" at step {payload['step']}" if payload.get("step") is not None else ""
    text = f":warning: Inflight run #{payload['run']} {run_name}: {payload['title']}{step}. {payload['message']}"
    return {"text": text, "inflight": payload}


def post_webhook(url: str, payload: dict[str, Any], run_name: str) -> bool:
    import httpx

    try:
        response = httpx.post(url, json=webhook_body(payload, run_name), timeout=WEBHOOK_TIMEOUT_S, follow_redirects=False)
        if response.status_code >= 400:
            logger.warning("alert webhook for run %s answered %s", payload["run"], response.status_code)
        return response.status_code < 400
    except httpx.HTTPError as exc:
        logger.warning("alert webhook for run %s failed: %s", payload["run"], exc)
        return False


def run_alerts(run: Run, limit: int = 200) -> list[dict[str, Any]]:
    return [alert_json(alert) for alert in Alert.objects.filter(run_id=run.pk).order_by("-id")[:limit]]


def alert_counts(run_ids: Sequence[int]) -> dict[int, int]:
    from django.db.models import Count

    rows = Alert.objects.filter(run_id__in=list(run_ids)).values("run_id").annotate(n=Count("id"))
    return {row["run_id"]: row["n"] for row in rows}
