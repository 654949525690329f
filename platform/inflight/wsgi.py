"""WSGI entry point (plain HTTP only; live updates need the ASGI app in asgi.py)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")

application = get_wsgi_application()
