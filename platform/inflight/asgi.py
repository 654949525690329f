"""ASGI entry point (Daphne): HTTP through Django, WebSockets to the live-update consumers."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

# Django must be set up before the consumers (which import models) are imported.
django_asgi_application = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from rl_core.common.processes import freeze_startup_objects  # noqa: E402

from inflight.live.routing import websocket_urlpatterns  # noqa: E402
from inflight.web.asgi_guards import SafeStaticFilesHandler, SameOriginWebsocketValidator  # noqa: E402

# Never serve with DEBUG off and no SECRET_KEY (settings.py says why importing alone does not refuse).
if settings.SECRET_KEY_MISSING and not settings.DEBUG:
    raise RuntimeError("SECRET_KEY must be set when DEBUG is off")

# The web node's event loop (pushes to pages) shares the GIL with the threads that render its
# views (a page's panel.json), and gives it up at every socket call. CPython hands it back to a
# waiting thread only once per switch interval (5 ms by default): the loop waited up to 5 ms per
# socket call while a view rendered, and the pushes queued for seconds (bench/platform_scale.py, 60
# live runs and 150 pages: push p95 6.4 s with the default, 0.33 s with 0.5 ms, the web node's CPU
# the same). Only here: a worker's supervisor threads are CPU-bound together, and on a full machine
# ten times the handovers made its ingest slower (200 live runs: ingest p95 3.5-6 s -> 10 s).
sys.setswitchinterval(settings.INFLIGHT_GIL_SWITCH_S)

# Static files (plotly.js, the UI's css/js) are served by Daphne through the staticfiles
# finders: no CDN, no whitenoise, no separate web server for the demo or the compose stack.
# A path that leaves the static folders (`/static/../x`) is a 404, never an error.
http_application = SafeStaticFilesHandler(django_asgi_application)

# The web server also watches for dead workers (their runs → `lost`), so it does not take a live
# worker to notice that the only one died. INFLIGHT_WEB_SWEEPER=0 turns it off.
if os.environ.get("INFLIGHT_WEB_SWEEPER", "1") != "0":
    from inflight.runs.liveness import start_sweeper_thread  # noqa: E402

    start_sweeper_thread("web")

application = ProtocolTypeRouter(
    {
        "http": http_application,
        # The Origin must be this site (scheme, host and port) or one of CSRF_TRUSTED_ORIGINS.
        "websocket": SameOriginWebsocketValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything loaded so far (Django, Channels, Twisted, the app: ~100,000 objects) is left out of the
# cyclic collector's full collections: each walked it all, holding the GIL, and with 500 open pages
# a full collection paused every push of the process for 140-610 ms, a dozen times a replay
# (bench/platform_scale.py, gc.callbacks timings). Reference counting still frees them.
freeze_startup_objects()
