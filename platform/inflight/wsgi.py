"""WSGI entry point (plain HTTP only; live updates need the ASGI app in asgi.py)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")

application = get_wsgi_application()

from django.conf import settings  # noqa: E402

# Never serve with DEBUG off and no SECRET_KEY (settings.py says why importing alone does not refuse).
if settings.SECRET_KEY_MISSING and not settings.DEBUG:
    raise RuntimeError("SECRET_KEY must be set when DEBUG is off")
