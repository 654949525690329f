"""Middleware that keeps bad input out and pages locked down.

`InputGuardMiddleware` (first in the chain) answers before any view runs:
- 413 for a body over DATA_UPLOAD_MAX_MEMORY_SIZE (by its Content-Length, or while reading it);
- 400 for a NUL character in the path, the query string or a form field (PostgreSQL text
  cannot hold one, and no legitimate input carries one).
API paths get the API's JSON error shape, pages a short text.

`DatabaseUnavailableMiddleware` answers 503 with a short message when PostgreSQL is away
(instead of a 500 error page per request).

`ContentSecurityPolicyMiddleware` sets settings.CONTENT_SECURITY_POLICY on every response
that has none: the pages load only the platform's own scripts.

`ApiErrorShapeMiddleware` gives every error under /api/ the API's JSON shape: an unknown API
path (Django's 404 page, or its debug page with DEBUG on) becomes `{"error": ...}` with the same
status, so a client always parses JSON. It is listed before CommonMiddleware, so it sees (and
leaves) that one's APPEND_SLASH redirect (`/api/runs` → `/api/runs/`), and after SecurityMiddleware
and the CSP one, so their headers land on the JSON answer.
"""

from __future__ import annotations

from typing import Callable

from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse
from django.http.multipartparser import MultiPartParserError

from inflight.api.errors import error_response
from inflight.datasets.validation import upload_body_limit

_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _refuse(request: HttpRequest, status: int, message: str) -> HttpResponse:
    if request.path_info.startswith("/api/"):
        return error_response(status, message)
    return HttpResponse(f"{status}: {message}\n", status=status, content_type="text/plain; charset=utf-8")


class InputGuardMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        refusal = self.refusal(request)
        return refusal if refusal is not None else self.get_response(request)

    def refusal(self, request: HttpRequest) -> HttpResponse | None:
        limit = upload_body_limit(request.path_info, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            return _refuse(request, 400, "Content-Length is not a number")
        if limit is not None and length > limit:
            return _refuse(request, 413, f"the request body is over {limit} bytes")
        query = request.META.get("QUERY_STRING", "")
        if "\x00" in request.path or "%00" in query or "\x00" in query:
            return _refuse(request, 400, "NUL characters are not accepted in URLs")
        if request.method == "POST" and request.content_type in _FORM_TYPES:
            try:
                fields = list(request.POST.lists())
            except RequestDataTooBig:
                return _refuse(request, 413, f"the request body is over {limit} bytes")
            except (TooManyFieldsSent, MultiPartParserError) as exc:
                return _refuse(request, 400, f"the form cannot be read: {exc}")
            for key, values in fields:
                if "\x00" in key or any("\x00" in value for value in values):
                    return _refuse(request, 400, "NUL characters are not accepted in form fields")
        return None


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = getattr(settings, "CONTENT_SECURITY_POLICY", "")
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response


class DatabaseUnavailableMiddleware:
    """PostgreSQL away → 503 "try again shortly" (JSON on API paths), logged in one line."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from django.db import InterfaceError, OperationalError

        try:
            return self.get_response(request)
        except (OperationalError, InterfaceError) as exc:
            return self.unavailable(request, exc)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        from django.db import InterfaceError, OperationalError

        if isinstance(exc, (OperationalError, InterfaceError)):
            return self.unavailable(request, exc)
        return None

    @staticmethod
    def unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
        import logging

        logging.getLogger(__name__).warning("%s %s: database unavailable (%s)", request.method, request.path, type(exc).__name__)
        response = _refuse(request, 503, "the database is unavailable; try again in a few seconds")
        response["Retry-After"] = "5"
        return response


class ApiErrorShapeMiddleware:
    """A non-JSON error answer on an /api/ path → the same status in the API's error shape."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code < 400 or not request.path_info.startswith("/api/"):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        if response.status_code == 404:
            message = f"no API endpoint at {request.path_info}" if not _resolves(request.path_info) else "not found"
        else:
            message = HTTPStatus(response.status_code).phrase.lower() if response.status_code in HTTPStatus._value2member_map_ else "error"
        shaped = error_response(response.status_code, message)
        for header in ("Allow", "Retry-After", "WWW-Authenticate"):
            if header in response:
                shaped[header] = response[header]
        return shaped


def _resolves(path: str) -> bool:
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        return False
    return True
