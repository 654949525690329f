from __future__ import annotations

from typing import Any

from django.http import HttpRequest


def inbox(request: HttpRequest) -> dict[str, Any]:
    """`inbox_unread`: the signed-in user's unread inbox entries, for the nav's count."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    from inflight.inbox.services import unread_count

    return {"inbox_unread": unread_count(user)}
