from __future__ import annotations

from django.apps import AppConfig


class InboxConfig(AppConfig):
    name = "inflight.inbox"
    label = "inbox"
    verbose_name = "Notifications (alerts and run ends) per user"

    def ready(self) -> None:
        # The receivers of Alert and Run saves: an inbox entry per alert and per run end.
        from inflight.inbox import signals  # noqa: F401
