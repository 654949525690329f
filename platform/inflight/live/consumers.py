"""WebSockets: `ws/runs/<id>/` (metric batches, status, eval scores and "panel changed" of one run,
and its new rollout rows while the page asks for them) and `ws/runs/` (status changes of the
signed-in user's runs, for the runs list).

The consumer accepts first and then closes with an application code, so the
browser can tell "sign in" (4401) from "not yours" (4403) and stops reconnecting.
Ingest already batches points; the consumer additionally coalesces bursts so a
client gets at most ~4 metric pushes a second (a slow tab is not flooded), paced by
`PushPacer` so that a batch arriving at the worker's own rhythm (every ~250 ms, with
jitter) is pushed at once instead of waiting out a fixed window.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from channels.db import database_sync_to_async
from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from inflight.live.broadcast import batch_text, join_batches, run_group, run_rollouts_group, user_runs_group
from inflight.runs.models import Run
from inflight.runs.selectors import visible_run_or_404

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
# Sustained pace of metric pushes to one client: one per PUSH_INTERVAL_S (4 a second)...
PUSH_INTERVAL_S = 0.25
# ...with room for half a push more after a quiet spell: so at most 5 pushes in any second,
# and a batch that comes 125-250 ms after the previous push (the worker polls every 250 ms,
# so this is the common jitter) goes out at once instead of waiting for the window to end.
PUSH_BURST = 1.5


@dataclass
class PushPacer:
    """Token bucket for one client's metric pushes: `rate` = 1/interval_s, capacity `burst`.

    A push needs one token. Over any span of T seconds at most `burst + T / interval_s`
    pushes go out, and when batches keep arriving faster than that a point waits at most
    `interval_s` (the push that takes it is the next one the bucket allows).
    """

    interval_s: float = PUSH_INTERVAL_S
    burst: float = PUSH_BURST
    tokens: float = PUSH_BURST
    updated_at: float | None = None

    def _refill(self, now: float) -> None:
        if self.updated_at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated_at) / self.interval_s)
        self.updated_at = now

    def wait_s(self, now: float) -> float:
        """Seconds from `now` until a push is allowed (0: push now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) * self.interval_s

    def take(self, now: float) -> None:
        """Record a push sent at `now`."""
        self._refill(now)
        self.tokens -= 1.0


def coalesce_batches(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge pending `metrics.batch` events into as few pushes as possible without hiding a gap.

    Only consecutive seqs are merged (`from_seq..seq`); a missing batch splits the
    pushes so the client notices the gap and refetches its snapshot. The points stay text
    (`live.broadcast.join_batches`): nothing is decoded or encoded again per page.
    """
    pushes: list[list[dict[str, Any]]] = []  # each: batches sorted by seq, without a gap
    for batch in sorted(batches, key=lambda event: int(event["seq"])):
        if pushes and int(batch.get("from_seq", batch["seq"])) <= int(pushes[-1][-1]["seq"]) + 1:
            pushes[-1].append(batch)
        else:
            pushes.append([batch])
    return [join_batches(push) for push in pushes]


# Group events the consumers forward to the page (RunConsumer, UserRunsConsumer): none of their
# handlers touches the database.
PUSH_EVENTS = frozenset({"metrics.batch", "run.status", "run.panel", "eval.score", "rollouts.batch", "alert.fired"})


class PushDispatch:
    """Channels closes stale database connections before every event a consumer handles, by a hop
    to its sync thread and back; for pushes, which never use the database, that was a quarter of
    a web node's CPU with 500 open pages (bench/platform_scale.py, py-spy). Pushes go straight
    to their handler; the socket's own events (connect, which reads the database) as before."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None) if message.get("type") in PUSH_EVENTS else None
        if handler is not None:
            await handler(message)
            return
        await super().dispatch(message)  # type: ignore[misc]


def _run_status(run_id: int) -> str | None:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


def _visible_run_id(user: Any, run_id: int) -> int | None:
    try:
        return visible_run_or_404(user, run_id).pk
    except Http404:
        return None


# What a run page may ask on its socket: the pushes of a tab it shows besides the charts. Rollout
# rows are the bulk of a run's pushes (at 200 live runs, 71 MB a replay of bench/platform_scale.py
# against ~10 MB of metric points) and only a page showing its Rollouts tab reads them.
WATCH_TOPICS = ("rollouts",)
WATCH_USAGE = 'this socket accepts only {"type": "watch", "rollouts": true or false}'


def watch_request(content: Any) -> dict[str, bool] | None:
    """The topics a `{"type": "watch", "<topic>": bool, ...}` message turns on or off; None when the
    message is anything else (the page gets an error answer)."""
    if not isinstance(content, dict) or content.get("type") != "watch":
        return None
    topics = {key: value for key, value in content.items() if key != "type"}
    if not topics or any(key not in WATCH_TOPICS or not isinstance(value, bool) for key, value in topics.items()):
        return None
    return topics


class RunConsumer(PushDispatch, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.group: str | None = None
        self.rollouts_group: str | None = None  # set while the page shows its Rollouts tab
        self.pending: list[dict[str, Any]] = []
        self.flush_task: asyncio.Task[None] | None = None
        self.pacer = PushPacer(interval_s=PUSH_INTERVAL_S, burst=PUSH_BURST, tokens=PUSH_BURST)
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        run_id = self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        if await database_sync_to_async(_visible_run_id)(user, run_id) is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        # Subscribed, then the state (zulip's order): a status change between the page's render
        # and this subscription was pushed to nobody, so "hello" carries the status as of now.
        await self.send_json({"type": "hello", "run_id": run_id, "status": await database_sync_to_async(_run_status)(run_id)})

    async def disconnect(self, code: int) -> None:
        if self.flush_task is not None:
            self.flush_task.cancel()
        for group in (self.group, self.rollouts_group):
            if group is not None:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """`{"type": "watch", "rollouts": true}`: the page shows its Rollouts tab and gets the run's
        `rollouts.batch` rows from now on (false: no more). Answered `{"type": "watching", ...}` once
        in effect, so the page loads the stored rows after it (subscribed, then the state: a row
        stored meanwhile is in the list or pushed, never neither)."""
        topics = watch_request(content) if self.group is not None else None
        if topics is None:
            await self.send_json({"type": "error", "message": WATCH_USAGE})
            return
        if topics["rollouts"] and self.rollouts_group is None:
            self.rollouts_group = run_rollouts_group(self.run_id)
            await self.channel_layer.group_add(self.rollouts_group, self.channel_name)
        elif not topics["rollouts"] and self.rollouts_group is not None:
            group, self.rollouts_group = self.rollouts_group, None
            await self.channel_layer.group_discard(group, self.channel_name)
        await self.send_json({"type": "watching", "rollouts": self.rollouts_group is not None})

    # ---- group events (type "metrics.batch" → method metrics_batch)

    async def metrics_batch(self, event: dict[str, Any]) -> None:
        self.pending.append(event)
        if self.flush_task is not None:
            return  # a push is already scheduled; it will carry this batch too
        delay = self.pacer.wait_s(asyncio.get_running_loop().time())
        if delay <= 0.0:
            await self._flush()
        else:
            self.flush_task = asyncio.ensure_future(self._flush_after(delay))

    async def _flush_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self.flush_task = None
        await self._flush()

    async def _flush(self) -> None:
        pending, self.pending = self.pending, []
        for push in coalesce_batches(pending):
            await self.send(text_data=batch_text(push))
        if pending:
            self.pacer.take(asyncio.get_running_loop().time())

    async def run_status(self, event: dict[str, Any]) -> None:
        # Points logged before the status change go out first.
        if self.flush_task is not None:
            self.flush_task.cancel()
            self.flush_task = None
        await self._flush()
        await self.send_json({key: event.get(key) for key in ("type", "run_id", "status", "error")})

    async def run_panel(self, event: dict[str, Any]) -> None:
        # "The actions panel changed": the page fetches panel.json again (runs.services).
        await self._forward(event)

    async def eval_score(self, event: dict[str, Any]) -> None:
        await self._forward(event)

    async def rollouts_batch(self, event: dict[str, Any]) -> None:
        # New rows of the rollout viewer (inflight.rollouts.services), for a page that asked to
        # watch them: already bounded per push.
        await self._forward(event)

    async def _forward(self, event: dict[str, Any]) -> None:
        """A push the page gets as it was sent: its JSON text was made once by the sender
        (live/broadcast.py FORWARDED_AS_TEXT); one queued before that change is encoded here."""
        if "text" in event:
            await self.send(text_data=event["text"])
        else:
            await self.send_json(dict(event))

    async def alert_fired(self, event: dict[str, Any]) -> None:
        await self.send_json(dict(event))


class UserRunsConsumer(PushDispatch, AsyncJsonWebsocketConsumer):
    """Status changes of the user's own runs (group `runs-user-<id>`); the runs list listens here.

    Staff also see other users' runs in the list; those rows are kept fresh by polling.
    """

    async def connect(self) -> None:
        self.group: str | None = None
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.group = user_runs_group(user.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.send_json({"type": "hello"})

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json({"type": "error", "message": "this socket only pushes updates; nothing is accepted from clients"})

    async def run_status(self, event: dict[str, Any]) -> None:
        await self.send_json({key: event.get(key) for key in ("type", "run_id", "status", "error")})

    async def alert_fired(self, event: dict[str, Any]) -> None:
        # The run list marks the run (inflight.alerts.services).
        await self.send_json({"type": "alert.fired", "run_id": event["alert"]["run"], "rule": event["alert"]["rule"]})
