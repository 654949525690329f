"""WebSocket routes, mounted by the backend's ASGI application."""

from __future__ import annotations

from django.urls import path

from inflight.live.consumers import RunConsumer, UserRunsConsumer

websocket_urlpatterns = [
    path("ws/runs/", UserRunsConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
