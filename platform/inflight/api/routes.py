"""The JSON API at /api/: one django-ninja application whose declarations are the views.

Each group of routes is an `ApiRouter` in the module that owns it (runs: api/run_actions.py;
metrics, evaluations, leaderboard, workers: api/views.py; logs and checkpoint downloads:
api/run_files.py; rollouts and exports: rollouts/api_views.py; alerts: alerts/api_views.py; datasets:
datasets/api_views.py),
mounted here. Ninja reads each route's path, parameters, body and answers from its signature and
`response=` (shapes in api/schema.py) and serves the OpenAPI document built from them at
/api/openapi.json, with Swagger UI at /api/docs/ (the package's own files, no CDN).

Errors keep the platform's one shape, `{"error": "<message>", ...}` (api/errors.py), through the
handlers below: a refused parameter or body names it (400), no token 401, other users' runs 404
(their existence is not revealed), a refusal by state 409, PostgreSQL away 503, and anything
unexpected is logged and answered 500 as JSON.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from django.http.request import RawPostDataException
from django.urls import reverse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError, ValidationErrorContext
from ninja.openapi.docs import Swagger

from inflight.alerts.api_views import router as alerts_router
from inflight.api import run_actions, run_files, sweeps, views
from inflight.api.auth import NOT_JSON, JsonBodyParser, TokenHeader, body_too_big
from inflight.api.errors import ApiError, error_response
from inflight.datasets.api_views import router as datasets_router
from inflight.rollouts.api_views import router as rollouts_router

logger = logging.getLogger(__name__)


class InflightApi(NinjaAPI):
    def validation_error_from_error_contexts(self, error_contexts: list[ValidationErrorContext]) -> ValidationError:
        """Ninja's errors, keeping what a clear message needs: the value sent and the field's bounds."""
        errors = []
        for context in error_contexts:
            model = context.model
            for error in context.pydantic_validation_error.errors(include_url=False):
                loc = model.__ninja_flatten_map_reverse__.get(error["loc"], error["loc"])
                errors.append({**error, "loc": (model.__ninja_param_source__, *loc), "bounds": _bounds(model, loc), "fields_of": _body_fields(model)})
        return ValidationError(errors)

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        """Built once per process (it depends on code only), under the prefix the site mounts /api/ at."""
        if self._document is None:
            prefix = reverse(f"{self.urls_namespace}:openapi-json").removesuffix(self.openapi_url.lstrip("/"))
            self._document = super().get_openapi_schema(path_prefix=prefix)
        return self._document

    _document: Any = None


def _bounds(model: Any, loc: tuple[Any, ...]) -> dict[str, Any]:
    field = model.model_fields.get(loc[0]) if loc else None
    bounds: dict[str, Any] = {}
    for constraint in getattr(field, "metadata", ()):
        for name in ("ge", "le", "gt", "lt"):
            if getattr(constraint, name, None) is not None:
                bounds[name] = getattr(constraint, name)
    return bounds


def _body_fields(model: Any) -> list[str]:
    """The field names of a body schema (for "unknown field" messages)."""
    if model.__ninja_param_source__ != "body":
        return []
    names = []
    for field in model.model_fields.values():
        inner = getattr(field.annotation, "model_fields", {})
        names += [sub.alias or name for name, sub in inner.items()]
    return names


api = InflightApi(
    title="Inflight API",
    version="1",
    description=(
        "Launch, watch and compare RL post-training runs. Every endpoint takes `Authorization: Token <key>` "
        "(in Swagger's Authorize box type `Token <key>`). Errors are `{\"error\": \"...\"}` (plus `fields` for a "
        "refused body or config); other users' runs answer 404."
    ),
    auth=TokenHeader(),
    urls_namespace="api",
    parser=JsonBodyParser(),
    # Depth 2: a run's body opens on its config's sections and their help, not on a folded "config".
    docs=Swagger(settings={"persistAuthorization": True, "defaultModelExpandDepth": 2}),
    docs_url="/docs/",
)
for router in (run_actions.router, sweeps.router, views.router, run_files.router, rollouts_router, alerts_router, datasets_router):
    api.add_router("/", router)


# ---------------------------------------------------------------- one error shape


def _parameter_message(error: dict[str, Any]) -> str:
    source, *path = error["loc"]
    name = ".".join(str(part) for part in path)
    where = f"{source} parameter {name!r}"
    kind, ctx, bounds = error["type"], error.get("ctx") or {}, error.get("bounds") or {}
    sent = str(error.get("input", ""))[:40]
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{where} must be an integer, got {sent!r}"
    if kind in ("float_parsing", "float_type", "finite_number"):
        return f"{where} must be a number, got {sent!r}"
    if kind in ("bool_parsing", "bool_type"):
        return f"{where} must be true or false, got {sent!r}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        if "ge" in bounds and "le" in bounds:
            return f"{where} must be an integer between {bounds['ge']} and {bounds['le']}"
        return f"{where} must be {error['msg'].removeprefix('Input should be ')}"
    if kind in ("literal_error", "enum"):
        return f"{where} must be {ctx.get('expected', '')}, got {sent!r}"
    return f"{where}: {error['msg']}"


_SHORT_TYPE_TEXTS = {
    "string_type": "must be a string", "int_type": "must be an integer", "bool_type": "must be true or false",
    "list_type": "must be a list", "dict_type": "must be an object", "model_type": "must be an object",
    "float_type": "must be a number",
}


def _body_errors(errors: list[dict[str, Any]]) -> HttpResponse:
    unknown = [str(error["loc"][-1]) for error in errors if error["type"] == "extra_forbidden"]
    if unknown:
        allowed = errors[0].get("fields_of") or []
        message = f"unknown field(s): {', '.join(unknown)}; send {', '.join(repr(name) for name in allowed)}"
        return error_response(400, message, fields={name: ["unknown field"] for name in unknown})
    fields: dict[str, list[str]] = {}
    for error in errors:
        path = ".".join(str(part) for part in error["loc"][2:]) or "body"  # loc: ("body", <the body parameter>, field...)
        text = _SHORT_TYPE_TEXTS.get(error["type"]) or error["msg"][:1].lower() + error["msg"][1:]
        fields.setdefault(path, []).append(text)
    message = "; ".join(f"'{path}' {', '.join(texts)}" for path, texts in fields.items())
    return error_response(400, message, fields=fields)


def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    body = [error for error in exc.errors if error["loc"][0] == "body"]
    if body:
        return _body_errors(body)
    return error_response(400, "; ".join(_parameter_message(error) for error in exc.errors))


def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return error_response(exc.status, exc.message, **exc.extra)


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if isinstance(exc.__cause__, ApiError):  # the body parser's refusal, wrapped by ninja
        return _api_error(request, exc.__cause__)
    return error_response(exc.status_code, str(exc))


def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    response = error_response(401, "authentication required: send the header 'Authorization: Token <key>'")
    response["WWW-Authenticate"] = "Token"
    return response


def _database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    # PostgreSQL is away: say so (503, retry later) instead of an internal error.
    text = str(exc).strip()
    logger.warning("API %s %s: database unavailable: %s", request.method, request.path, text.splitlines()[0] if text else type(exc).__name__)
    response = error_response(503, "the database is unavailable; try again in a few seconds")
    response["Retry-After"] = "5"
    return response


def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.error("API error in %s %s", request.method, request.path, exc_info=exc)
    return error_response(500, "internal error; the server log has the details")


for exception, handler in (
    (ApiError, _api_error),
    (ValidationError, _validation_error),
    (HttpError, _http_error),
    (AuthenticationError, _unauthenticated),
    (Http404, lambda request, exc: error_response(404, str(exc) or "not found")),  # selectors.visible_run_or_404 and friends
    (PermissionDenied, lambda request, exc: error_response(403, str(exc) or "permission denied")),
    (RequestDataTooBig, lambda request, exc: body_too_big()),
    # A multipart body was already streamed into request.POST (the input guard reads form bodies
    # for NUL checks), so Django cannot give the raw bytes back: it was not JSON anyway.
    (RawPostDataException, lambda request, exc: error_response(415, NOT_JSON.format(content_type=(request.content_type or "")[:80]))),
    (OperationalError, _database_unavailable),
    (InterfaceError, _database_unavailable),
    (Exception, _unexpected),
):
    api.add_exception_handler(exception, handler)  # type: ignore[arg-type]
