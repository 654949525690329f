"""The run WebSocket over the real Redis channel layer and real session auth.

The ASGI application under test is the project's own (`inflight.asgi.application`:
origin check, session auth, URL router); pushes come from the real services after
their transactions commit.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from inflight.asgi import application
from inflight.live import consumers
from inflight.live.broadcast import batch_points, batch_text
from inflight.live.consumers import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED, PushPacer, coalesce_batches
from inflight.runs import evaluations, services
from inflight.runs.models import RunStatus
from inflight.live.ingest import PointIn
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
async def close_thread_connections() -> Any:
    """The consumer's and our own database_sync_to_async calls run on a worker thread with its
    own connection; close it so the test database can be dropped at the end of the session."""
    yield
    from django.db import connections

    await database_sync_to_async(connections.close_all)()


def _session_cookie(user: Any) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def _connect(run_id: int, user: Any | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    if user is not None:
        cookie = await database_sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


def _points(first_line: int, count: int) -> list[PointIn]:
    return [PointIn(line=first_line + i, name="reward/mean", step=first_line + i, t=1000.0 + first_line + i, value=float(i)) for i in range(count)]


async def test_owner_receives_batches_status_and_evals(owner, monkeypatch) -> None:
    # One push allowed per 2 s: the second and third batch surely land inside that window,
    # however slowly a loaded machine stores them.
    monkeypatch.setattr(consumers, "PUSH_INTERVAL_S", 2.0)
    monkeypatch.setattr(consumers, "PUSH_BURST", 1.0)
    run = await database_sync_to_async(services.create_run)(owner, "live", {})
    socket = await _connect(run.pk, owner)
    # Subscribed, then the state: the status as of the subscription.
    assert await socket.receive_json_from(timeout=10) == {"type": "hello", "run_id": run.pk, "status": run.status}

    await database_sync_to_async(live_ingest.ingest_metrics)(run.pk, _points(0, 3))
    first = await socket.receive_json_from(timeout=10)
    assert first["type"] == "metrics.batch" and first["seq"] == 1 and first["from_seq"] == 1
    assert [point[1] for point in first["points"]] == [0, 1, 2]

    # A burst inside the push interval arrives as one coalesced push covering both batches.
    await database_sync_to_async(live_ingest.ingest_metrics)(run.pk, _points(3, 2))
    await database_sync_to_async(live_ingest.ingest_metrics)(run.pk, _points(5, 2))
    burst = await socket.receive_json_from(timeout=10)
    assert (burst["from_seq"], burst["seq"]) == (2, 3)
    assert [point[1] for point in burst["points"]] == [3, 4, 5, 6]

    await database_sync_to_async(services.request_cancel)(run, owner)  # queued → cancelled
    status = await socket.receive_json_from(timeout=10)
    assert status == {"type": "run.status", "run_id": run.pk, "status": RunStatus.CANCELLED, "error": ""}

    line = {"benchmark": "math500", "step": 2, "k": 4, "mean_at_k": 0.25, "pass_at_k": 0.5, "num_problems": 1, "num_samples": 4}
    await database_sync_to_async(evaluations.ingest_eval)(run.pk, line, [])
    score = await socket.receive_json_from(timeout=10)
    assert score["type"] == "eval.score" and score["benchmark"] == "math500" and score["mean_at_k"] == 0.25

    await socket.send_json_to({"type": "subscribe"})
    assert (await socket.receive_json_from(timeout=10))["type"] == "error"
    await socket.disconnect()


async def test_staff_may_watch_any_run(owner, staff_user) -> None:
    run = await database_sync_to_async(services.create_run)(owner, "live", {})
    socket = await _connect(run.pk, staff_user)
    assert (await socket.receive_json_from(timeout=10))["type"] == "hello"
    await socket.disconnect()


async def test_other_users_and_anonymous_are_refused(owner, other_user) -> None:
    run = await database_sync_to_async(services.create_run)(owner, "live", {})
    for user, code in ((other_user, CLOSE_FORBIDDEN), (None, CLOSE_UNAUTHENTICATED)):
        socket = await _connect(run.pk, user)
        closed = await socket.receive_output(timeout=10)
        assert closed == {"type": "websocket.close", "code": code}
        # and it is not in the group: a push for the run reaches nobody on this socket
        await database_sync_to_async(live_ingest.ingest_metrics)(run.pk, _points(100 + code, 1))
        await asyncio.sleep(0.5)
        assert await socket.receive_nothing(timeout=0.5)
        await socket.disconnect()
    for missing_id in (987_654, 10**30):
        missing = await _connect(missing_id, owner)
        assert await missing.receive_output(timeout=10) == {"type": "websocket.close", "code": CLOSE_FORBIDDEN}


def test_coalescing_never_hides_a_gap() -> None:
    batches = [
        {"type": "metrics.batch", "seq": 7, "points": [["a", 7, 7.0, 1.0]]},
        {"type": "metrics.batch", "seq": 5, "points": [["a", 5, 5.0, 1.0]]},
        {"type": "metrics.batch", "seq": 6, "points": [["a", 6, 6.0, 1.0]]},
        {"type": "metrics.batch", "seq": 9, "points": [["a", 9, 9.0, 1.0]]},
    ]
    pushes = coalesce_batches(batches)
    assert [(push["from_seq"], push["seq"]) for push in pushes] == [(5, 7), (9, 9)]
    assert [point[1] for point in batch_points(pushes[0])] == [5, 6, 7]
    # What the page receives: the same JSON as one encoded from the points.
    assert json.loads(batch_text(pushes[0])) == {"type": "metrics.batch", "from_seq": 5, "seq": 7, "points": [["a", s, float(s), 1.0] for s in (5, 6, 7)]}


def test_push_pacer_allows_a_prompt_push_after_jitter_and_caps_the_rate() -> None:
    pacer = PushPacer(interval_s=0.25, burst=1.5, tokens=1.5)
    assert pacer.wait_s(0.0) == 0.0
    pacer.take(0.0)
    # The next batch comes 150 ms later (the worker's 250 ms poll, arriving early): it goes at once.
    assert pacer.wait_s(0.15) == 0.0
    pacer.take(0.15)
    # A third one right behind it waits for the bucket: at most one interval.
    wait = pacer.wait_s(0.16)
    assert 0.0 < wait <= 0.25
    # A steady flood of batches every 10 ms for 10 s: pushes as the pacer allows them.
    pacer = PushPacer(interval_s=0.25, burst=1.5, tokens=1.5)
    pushes: list[float] = []
    now, next_push = 0.0, 0.0
    while now < 10.0:
        if now >= next_push:
            wait = pacer.wait_s(now)
            if wait == 0.0:
                pacer.take(now)
                pushes.append(now)
            else:
                next_push = now + wait
        now = round(now + 0.01, 6)
    per_window = [sum(1 for t in pushes if start <= t < start + 1.0) for start in [i / 100 for i in range(0, 900)]]
    assert max(per_window) <= 5  # never more than ~4 a second (5 in the worst window)
    assert 39 <= len(pushes) <= 42  # 4 a second sustained, plus the initial half push
    gaps = [b - a for a, b in zip(pushes, pushes[1:])]
    assert max(gaps) <= 0.25 + 0.011  # no point waits longer than one interval


async def _connect_list(user: Any | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    if user is not None:
        cookie = await database_sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, "/ws/runs/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    return communicator


async def test_runs_list_socket_pushes_only_the_users_own_status_changes(owner, other_user) -> None:
    mine = await _connect_list(owner)
    theirs = await _connect_list(other_user)
    assert (await mine.receive_json_from(timeout=10))["type"] == "hello"
    assert (await theirs.receive_json_from(timeout=10))["type"] == "hello"
    run = await database_sync_to_async(services.create_run)(owner, "listed", {})
    await database_sync_to_async(services.request_cancel)(run, owner)
    pushed = [await mine.receive_json_from(timeout=10) for _ in range(2)]
    assert [(p["run_id"], p["status"]) for p in pushed] == [(run.pk, RunStatus.QUEUED), (run.pk, RunStatus.CANCELLED)]
    assert await theirs.receive_nothing(timeout=1)
    anonymous = await _connect_list(None)
    assert await anonymous.receive_output(timeout=10) == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
    await mine.disconnect()
    await theirs.disconnect()


async def test_pushes_skip_the_database_housekeeping_the_socket_events_keep(owner, monkeypatch) -> None:
    """A push reaches the page without the per-event stale-connection check (a thread hop that
    was a quarter of a web node's CPU with 500 pages); connecting, which reads the database, keeps it."""
    import channels.consumer

    checks: list[str] = []
    original = channels.consumer.aclose_old_connections

    async def counting() -> None:
        checks.append("check")
        await original()

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counting)
    run = await database_sync_to_async(services.create_run)(owner, "live", {})
    socket = await _connect(run.pk, owner)
    # Subscribed, then the state: the status as of the subscription.
    assert await socket.receive_json_from(timeout=10) == {"type": "hello", "run_id": run.pk, "status": run.status}
    assert checks  # websocket.connect went through Channels' dispatch
    before = len(checks)
    await database_sync_to_async(live_ingest.ingest_metrics)(run.pk, _points(0, 2))
    pushed = await socket.receive_json_from(timeout=10)
    assert pushed["type"] == "metrics.batch" and pushed["seq"] == 1
    await database_sync_to_async(services.announce_run_panel_changed)(run.pk)
    assert await socket.receive_json_from(timeout=10) == {"type": "run.panel", "run_id": run.pk}
    assert len(checks) == before
    await socket.disconnect()


async def test_rollout_rows_reach_only_the_pages_that_watch_them(owner) -> None:
    """A page showing its charts gets no rollout rows; one that asks for them (its Rollouts tab shows)
    gets each batch once its ask was answered, until it asks no more; anything else it sends is an error."""
    from test_rollouts import DECODER, make_run, sample

    from inflight.rollouts.services import ingest_rollouts

    run = await database_sync_to_async(make_run)(owner)
    charts, viewer = await _connect(run.pk, owner), await _connect(run.pk, owner)
    for socket in (charts, viewer):
        assert (await socket.receive_json_from(timeout=10))["type"] == "hello"

    await viewer.send_json_to({"type": "watch", "rollouts": True})
    assert await viewer.receive_json_from(timeout=10) == {"type": "watching", "rollouts": True}
    await database_sync_to_async(ingest_rollouts)(run.pk, [(line, sample(line)) for line in range(4)], DECODER)
    pushed = await viewer.receive_json_from(timeout=10)
    assert pushed["type"] == "rollouts.batch" and len(pushed["rows"]) == 4
    assert await charts.receive_nothing(timeout=1)

    await viewer.send_json_to({"type": "watch", "rollouts": False})
    assert await viewer.receive_json_from(timeout=10) == {"type": "watching", "rollouts": False}
    await database_sync_to_async(ingest_rollouts)(run.pk, [(line, sample(line)) for line in range(4, 8)], DECODER)
    await database_sync_to_async(live_ingest.ingest_metrics)(run.pk, _points(0, 1))  # the socket still carries the charts' pushes
    for socket in (viewer, charts):
        assert (await socket.receive_json_from(timeout=10))["type"] == "metrics.batch"
    assert await viewer.receive_nothing(timeout=1)

    for bad in ({"type": "watch", "rollouts": "yes"}, {"type": "watch", "logs": True}, {"type": "watch"}, ["watch"]):
        await charts.send_json_to(bad)
        answer = await charts.receive_json_from(timeout=10)
        assert answer["type"] == "error" and '"watch"' in answer["message"], bad
    await charts.disconnect()
    await viewer.disconnect()
