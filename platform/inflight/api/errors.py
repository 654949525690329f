"""The one JSON error shape of the platform: `{"error": "<message>", ...extra}`.

Every JSON answer that reports a failure goes through `error_response`: the token API
(`api.auth.api_view`), the pages' JSON endpoints (`web.views`) and the input guards
(`web.middleware`). Extra keys sit beside `error` (e.g. `fields` for a refused config,
`run` for a run that could not be queued), as the README documents.
"""

from __future__ import annotations

from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import JsonResponse


class ApiError(Exception):
    """Raised by a view to answer with `status` and `{"error": message, ...extra}`."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


def json_response(data: Any, status: int = 200) -> JsonResponse:
    return JsonResponse(data, status=status, safe=False, encoder=DjangoJSONEncoder)


def error_response(status: int, message: str, **extra: Any) -> JsonResponse:
    return json_response({"error": message, **extra}, status=status)
