"""ASGI entry point (Daphne): HTTP through Django, WebSockets to the live-update consumers."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

# Django must be set up before the consumers (which import models) are imported.
django_asgi_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from inflight.live.routing import websocket_urlpatterns  # noqa: E402

# Static files (plotly.js, the UI's css/js) are served by Daphne through the staticfiles
# finders: no CDN, no whitenoise, no separate web server for the demo or the compose stack.
http_application = ASGIStaticFilesHandler(django_asgi_application)

application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
