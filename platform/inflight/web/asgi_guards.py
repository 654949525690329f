"""ASGI wrappers of asgi.py: static files that never error, and the WebSocket Origin check.

- `SafeStaticFilesHandler`: Django's static handler answers a path that leaves the static
  folders (`/static/../settings.py`, `/static/%00`) with an exception, i.e. a 500; here it is a 404.
  Its answers carry `X-Content-Type-Options: nosniff`, as the pages do.
- `SameOriginWebsocketValidator`: channels' AllowedHostsOriginValidator compares only the
  Origin's host name, so `http://127.0.0.1:9999` passed for a site on port 8000. A socket is
  accepted only when its Origin is exactly this site (scheme, host and port of the request,
  whose Host must be in ALLOWED_HOSTS) or one of CSRF_TRUSTED_ORIGINS.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.http.request import split_domain_port, validate_host


class SafeStaticFilesHandler(ASGIStaticFilesHandler):
    def serve(self, request: HttpRequest) -> HttpResponse:
        try:
            return super().serve(request)
        except (SuspiciousOperation, ValueError, OSError) as exc:
            raise Http404("no such static file") from exc

    async def get_response_async(self, request: HttpRequest) -> HttpResponse:
        try:
            response = await super().get_response_async(request)
        except Exception:  # noqa: BLE001 - whatever a static path does, it is not a server error
            response = HttpResponse("404: no such static file\n", status=404, content_type="text/plain")
        # Static files are answered here, outside Django's middleware, so SecurityMiddleware's
        # nosniff (settings.SECURE_CONTENT_TYPE_NOSNIFF) would never reach them.
        if settings.SECURE_CONTENT_TYPE_NOSNIFF:
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response


def _origin(scheme: str, netloc: str) -> tuple[str, str, int | None] | None:
    parsed = urlparse(f"{scheme}://{netloc}")
    try:
        port = parsed.port
    except ValueError:
        return None
    if parsed.hostname is None:
        return None
    return parsed.scheme, parsed.hostname, port or (443 if parsed.scheme == "https" else 80)


class SameOriginWebsocketValidator(OriginValidator):
    def __init__(self, application: Any) -> None:
        super().__init__(application, allowed_origins=[])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers", []))
        try:
            origin_text = headers.get(b"origin", b"").decode("latin1")
            host = headers.get(b"host", b"").decode("latin1")
        except UnicodeDecodeError:
            origin_text, host = "", ""
        if origin_text and self.allowed(origin_text, host, scope.get("scheme", "ws")):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    @staticmethod
    def allowed(origin_text: str, host: str, ws_scheme: str) -> bool:
        parsed = urlparse(origin_text)
        if parsed.scheme not in ("http", "https") or parsed.path not in ("", "/"):
            return False
        origin = _origin(parsed.scheme, parsed.netloc)
        if origin is None:
            return False
        trusted = {_origin(urlparse(item).scheme, urlparse(item).netloc) for item in settings.CSRF_TRUSTED_ORIGINS}
        if origin in trusted:
            return True
        domain, _ = split_domain_port(host)
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            return False
        own = _origin("https" if ws_scheme == "wss" else "http", host)
        return origin == own
