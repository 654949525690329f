"""/api/: the routes of the one ninja application (api/routes.py), its OpenAPI document
(/api/openapi.json) and Swagger UI page (/api/docs/) — public: they describe the API, not anyone's
data. Ninja lists a route once per method and adds a bare root; here each route appears once and
/api/ itself is no endpoint (it answers the API's JSON 404)."""

from __future__ import annotations

from django.urls import URLPattern

from inflight.api.routes import api

app_name = "api"


def _routes() -> list[URLPattern]:
    seen: set[str] = set()
    patterns = []
    for pattern in api.urls[0]:
        route = str(pattern.pattern)
        if route and route not in seen:
            seen.add(route)
            patterns.append(pattern)
    return patterns


urlpatterns = _routes()
