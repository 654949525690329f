"""WebSocket routes, mounted by the backend's ASGI application."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import path, re_path

from inflight.live.consumers import RunConsumer, UserRunsConsumer

CLOSE_NOT_FOUND = 4404


class NotFoundConsumer(AsyncWebsocketConsumer):
    """Any other WebSocket path: refused at the handshake (an unmatched route would be a server error)."""

    async def connect(self) -> None:
        await self.close(code=CLOSE_NOT_FOUND)


websocket_urlpatterns = [
    path("ws/runs/", UserRunsConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
    re_path(r"", NotFoundConsumer.as_asgi()),
]
