"""`run.panel` pushes ("the run's actions panel changed; fetch it again") over the real Redis
channel layer to a subscribed run socket: sent by `services.announce_run_panel_changed`, by the
actions that change what the panel shows (a fork of the run, tags/note/archive, a child deleted)
and by the worker when the run's checkpoints/ folder changes (`PlatformReporter.checkpoints_changed`).
The run page fetches panel.json on these instead of polling it every 5 s (issue 24)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from inflight.runs import actions, services
from inflight.runs.models import Run, RunStatus
from test_live_consumer import _connect as open_run_socket, close_thread_connections  # noqa: F401 - the autouse fixture by name

pytestmark = pytest.mark.django_db(transaction=True)


async def _connect(run_id: int, user: Any) -> WebsocketCommunicator:
    communicator = await open_run_socket(run_id, user)
    hello = await communicator.receive_json_from(timeout=10)
    assert hello["type"] == "hello" and hello["run_id"] == run_id
    return communicator


async def _next_of_type(socket: WebsocketCommunicator, kind: str) -> dict[str, Any]:
    """The next push of `kind` (status pushes of runs created meanwhile may come first)."""
    while True:
        message = await socket.receive_json_from(timeout=10)
        if message["type"] == kind:
            return message


def _running_run(owner: Any, tiny_config: dict[str, Any], name: str) -> Run:
    return Run.objects.create(owner=owner, name=name, config={**tiny_config, "name": name}, status=RunStatus.RUNNING, started_at=timezone.now())


async def test_announce_reaches_the_runs_socket_only(owner, tiny_config) -> None:
    run = await database_sync_to_async(_running_run)(owner, tiny_config, "watched")
    other = await database_sync_to_async(_running_run)(owner, tiny_config, "other")
    socket = await _connect(run.pk, owner)
    await database_sync_to_async(services.announce_run_panel_changed)(other.pk)
    await database_sync_to_async(services.announce_run_panel_changed)(run.pk)
    assert await socket.receive_json_from(timeout=10) == {"type": "run.panel", "run_id": run.pk}
    assert await socket.receive_nothing(timeout=0.5)
    await socket.disconnect()


async def test_edits_forks_and_deleted_children_announce_the_panel(owner, tiny_config) -> None:
    source = await database_sync_to_async(_running_run)(owner, tiny_config, "source")
    socket = await _connect(source.pk, owner)

    await database_sync_to_async(actions.update_run)(source, owner, {"tags": ["sweep"], "note": "lr 3e-4"})
    assert await _next_of_type(socket, "run.panel") == {"type": "run.panel", "run_id": source.pk}
    # Nothing changed: nothing to fetch.
    source = await database_sync_to_async(Run.objects.get)(pk=source.pk)
    await database_sync_to_async(actions.update_run)(source, owner, {})
    assert await socket.receive_nothing(timeout=0.5)

    # A run cloned from it: the source's panel lists it.
    clone = await database_sync_to_async(actions.clone_run)(owner, source, "child")
    assert await _next_of_type(socket, "run.panel") == {"type": "run.panel", "run_id": source.pk}

    # Deleting that child (once it ended) takes it off the list again.
    await database_sync_to_async(Run.objects.filter(pk=clone.pk).update)(status=RunStatus.CANCELLED, finished_at=timezone.now())
    clone = await database_sync_to_async(Run.objects.get)(pk=clone.pk)
    await database_sync_to_async(actions.delete_run)(clone, owner)
    assert await _next_of_type(socket, "run.panel") == {"type": "run.panel", "run_id": source.pk}
    await socket.disconnect()


async def test_the_worker_announces_a_changed_checkpoints_folder(owner, tiny_config) -> None:
    from workers.tasks import PlatformReporter

    run = await database_sync_to_async(_running_run)(owner, tiny_config, "checkpointing")
    socket = await _connect(run.pk, owner)
    reporter = PlatformReporter(run.pk)
    await database_sync_to_async(reporter.checkpoints_changed)()
    assert await socket.receive_json_from(timeout=10) == {"type": "run.panel", "run_id": run.pk}
    await socket.disconnect()
