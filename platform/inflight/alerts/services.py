"""Evaluate the rules on ingest, store alerts once per episode, push them live, POST webhooks.

Called by the worker's reporter after the data itself was stored: `evaluate_metric_lines`
after each metrics batch, `evaluate_eval` after each evaluation, `check_stalled` on each poll
without new metrics. Pushes to the run's group after commit:
`{"type": "alert.fired", "alert": {...}}`; the same goes to the owner's run-list group.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

from django.conf import settings
from django.db import transaction

from inflight.alerts.models import Alert, AlertCursor, AlertEpisode, AlertWebhook
from inflight.alerts.rules import RULES, Firing, Verdicts, check_line
from inflight.live.broadcast import _group_send, run_group, user_runs_group
from inflight.runs.models import EvalScore, Run
from rl_core.config import AlertsConfig
from rl_core.evaluation import HELDOUT_BENCHMARK

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


def evaluate_metric_lines(run_id: int, records: Sequence[tuple[int, dict[str, Any]]]) -> list[Alert]:
    """Evaluate metrics.jsonl lines (line number, record) not evaluated before, in order."""
    if not records:
        return []
    with transaction.atomic():
        run = Run.objects.only("id", "owner_id", "name", "config").get(pk=run_id)
        cfg, max_lag = _settings(run.config)
        if not cfg.enabled:
            return []
        AlertCursor.objects.get_or_create(run_id=run_id)
        cursor = AlertCursor.objects.select_for_update().get(run_id=run_id)
        # Read once under the cursor lock: a run's episodes are written only by its own supervisor.
        active = set(AlertEpisode.objects.filter(run_id=run_id, active=True).values_list("rule", "key"))
        fired: list[Alert] = []
        for line, record in sorted(records, key=lambda item: item[0]):
            if line < cursor.next_line:
                continue  # a re-sent line: already evaluated
            verdicts = check_line(record, cfg, max_lag, cursor.windows)
            fired += _apply(run, verdicts, _step(record), active)
            cursor.next_line = line + 1
        cursor.save()
    return fired


def _step(record: dict[str, Any]) -> int | None:
    try:
        return int(record.get("step"))
    except (TypeError, ValueError):
        return None


def evaluate_eval(run_id: int, score: EvalScore) -> list[Alert]:
    """`eval_drop`: this evaluation's mean@k is `eval_drop` or more below the benchmark's best.
    The held-out set's evaluation has its own rule on its `success/heldout` metric
    (`heldout_collapse`, with its window and threshold): one alert per signal, not two."""
    if score.benchmark == HELDOUT_BENCHMARK:
        return []
    with transaction.atomic():
        run = Run.objects.only("id", "owner_id", "name", "config").get(pk=run_id)
        cfg, _ = _settings(run.config)
        if not cfg.enabled:
            return []
        earlier = EvalScore.objects.filter(run_id=run_id, benchmark=score.benchmark, step__lt=score.step)
        best = max((s.mean_at_k for s in earlier), default=None)
        verdicts = Verdicts()
        pair = ("eval_drop", score.benchmark)
        if best is not None and best - score.mean_at_k >= cfg.eval_drop:
            verdicts.firing[pair] = Firing(
                f"{score.benchmark} mean@{score.k} {score.mean_at_k:.3f} at step {score.step} is {best - score.mean_at_k:.3f} below its best {best:.3f}",
                {"benchmark": score.benchmark, "mean_at_k": score.mean_at_k, "best": best, "threshold": cfg.eval_drop},
            )
        else:
            verdicts.clear.add(pair)
        return _apply(run, verdicts, score.step)


def check_stalled(run_id: int, idle_s: float, last_step: int | None) -> list[Alert]:
    """`stalled`: the run is running and logged no metric for `stall_s` seconds; `idle_s` = 0
    (metrics arrived) ends the episode."""
    with transaction.atomic():
        run = Run.objects.only("id", "owner_id", "name", "config", "status").get(pk=run_id)
        cfg, _ = _settings(run.config)
        if not cfg.enabled:
            return []
        verdicts = Verdicts()
        if idle_s >= cfg.stall_s and run.status == "running":
            verdicts.firing[("stalled", "")] = Firing(
                f"no metrics for {idle_s:.0f} s while running (threshold {cfg.stall_s:g} s)", {"idle_s": idle_s, "threshold": cfg.stall_s}
            )
        else:
            verdicts.clear.add(("stalled", ""))
        return _apply(run, verdicts, last_step)


# ---------------------------------------------------------------- delivery


def _announce(payload: dict[str, Any], owner_id: int, run_name: str) -> None:
    message = {"type": "alert.fired", "alert": payload}
    _group_send(run_group(payload["run"]), message)
    _group_send(user_runs_group(owner_id), message)
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
