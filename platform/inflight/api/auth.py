"""Token authentication and JSON plumbing shared by the API views."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest
from django.http.request import RawPostDataException
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from inflight.accounts.services import authenticate_token
from inflight.api.errors import ApiError, error_response, json_response
from inflight.runs.safe_input import MAX_INT, UnsafeInput, load_json

logger = logging.getLogger(__name__)


def read_json_body(request: HttpRequest) -> dict[str, Any]:
    not_json = f"send JSON (Content-Type: application/json), not {(request.content_type or '')[:80]}"
    try:
        body = request.body
    except RequestDataTooBig as exc:
        raise ApiError(413, f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes") from exc
    except RawPostDataException as exc:
        # A multipart body was already streamed into request.POST (the input guard reads form
        # bodies for NUL checks), so Django cannot give the raw bytes back: it was not JSON anyway.
        raise ApiError(415, not_json) from exc
    if not body:
        return {}
    if request.content_type not in ("application/json", ""):
        raise ApiError(415, not_json)
    try:
        data = load_json(body)
    except UnsafeInput as exc:
        raise ApiError(400, str(exc)) from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    return data


def int_param(request: HttpRequest, name: str, default: int | None = None, minimum: int = 0, maximum: int = MAX_INT) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > 40:
        raise ApiError(400, f"query parameter {name!r} must be an integer between {minimum} and {maximum}")
    try:
        value = int(raw)
    except ValueError as exc:
        raise ApiError(400, f"query parameter {name!r} must be an integer, got {raw!r}") from exc
    if not minimum <= value <= maximum:
        raise ApiError(400, f"query parameter {name!r} must be an integer between {minimum} and {maximum}")
    return value


def page_links(request: HttpRequest, count: int, offset: int, limit: int) -> dict[str, Any]:
    """Pagination metadata of an offset-paged list: the total and the URLs of the pages beside
    this one (None at either end), with every other query parameter kept."""

    def link(at: int) -> str:
        query = request.GET.copy()
        query["offset"] = str(at)
        query["limit"] = str(limit)
        return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

    return {
        "count": count,
        "limit": limit,
        "offset": offset,
        "next": link(offset + limit) if offset + limit < count else None,
        "previous": link(max(0, offset - limit)) if offset > 0 else None,
    }


def api_view(*methods: str) -> Callable[[Callable[..., Any]], Callable[..., HttpResponseBase]]:
    """Token-authenticated JSON endpoint: `Authorization: Token <key>`.

    401 without a valid token, 405 for other methods, ApiError → its status, Http404 → 404,
    PermissionDenied → 403; an unexpected error is logged and answered 500 as JSON."""

    def decorate(view: Callable[..., Any]) -> Callable[..., HttpResponseBase]:
        @csrf_exempt  # token auth, no cookies: CSRF cannot apply
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            try:
                return handle(request, *args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                # PostgreSQL is away: say so (503, retry later) instead of an internal error.
                logger.warning("API %s %s: database unavailable: %s", request.method, request.path, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
                response = error_response(503, "the database is unavailable; try again in a few seconds")
                response["Retry-After"] = "5"
                return response

        def handle(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method not in methods:
                response = error_response(405, f"method {request.method} not allowed; use {', '.join(methods)}")
                response["Allow"] = ", ".join(methods)
                return response
            header = request.headers.get("Authorization", "")
            scheme, _, key = header.partition(" ")
            user = authenticate_token(key.strip()) if scheme.lower() == "token" else None
            if user is None:
                response = error_response(401, "authentication required: send the header 'Authorization: Token <key>'")
                response["WWW-Authenticate"] = "Token"
                return response
            request.user = user
            try:
                result = view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.message, **exc.extra)
            except Http404 as exc:  # selectors.visible_run_or_404 and friends
                return error_response(404, str(exc) or "not found")
            except PermissionDenied as exc:
                return error_response(403, str(exc) or "permission denied")
            except (OperationalError, InterfaceError):
                raise
            except Exception:
                logger.exception("API error in %s %s", request.method, request.path)
                return error_response(500, "internal error; the server log has the details")
            # A download (StreamingHttpResponse, FileResponse) passes through as the view built it.
            return result if isinstance(result, HttpResponseBase) else json_response(result)

        return wrapper

    return decorate
