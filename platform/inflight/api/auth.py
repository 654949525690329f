"""Token authentication and the pieces every API route shares: its router, the JSON body parser,
typed query parameters and pagination links.

Every route is a django-ninja operation on an `ApiRouter` (see docs/ARCHITECTURE.md, "JSON API"):
`Authorization: Token <key>` is checked before anything else; the session cookie is not read, so
no cross-site page can act with a signed-in user's rights and CSRF cannot apply.
"""

from __future__ import annotations

from typing import Any, Optional

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from ninja import Router
from ninja.operation import PathView
from ninja.parser import Parser
from ninja.security import APIKeyHeader
from pydantic import BeforeValidator
from pydantic_core import PydanticUseDefault
from typing_extensions import Annotated

from inflight.accounts.services import authenticate_token
from inflight.api.errors import ApiError, error_response
from inflight.runs.safe_input import UnsafeInput, load_json

NOT_JSON = "send JSON (Content-Type: application/json), not {content_type}"


class TokenHeader(APIKeyHeader):
    """`Authorization: Token <key>` (the demo prints a key; `manage.py create_token USER` makes one)."""

    param_name = "Authorization"

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        scheme, _, token = (key or "").partition(" ")
        user = authenticate_token(token.strip()) if scheme.lower() == "token" else None
        if user is not None:
            request.user = user  # the views and services read request.user, as the pages' views do
        return user


class JsonBodyParser(Parser):
    """Bodies are JSON objects, read with the platform's bounded loader (depth, size, NaN)."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        if request.content_type not in ("application/json", ""):
            raise ApiError(415, NOT_JSON.format(content_type=(request.content_type or "")[:80]))
        try:
            data = load_json(request.body)
        except UnsafeInput as exc:
            raise ApiError(400, str(exc)) from exc
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object")
        return data


class _MethodCheckingPathView(PathView):
    """A path's operations; another method answers 405 in the API's error shape, with `Allow`
    listing the path's methods in their declared order."""

    def _sync_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if self._find_operation(request) is None:
            methods = list(dict.fromkeys(method for operation in self.operations for method in operation.methods))
            response = error_response(405, f"method {request.method} not allowed; use {', '.join(methods)}")
            response["Allow"] = ", ".join(methods)
            return response
        return super()._sync_view(request, *args, **kwargs)

    def clone(self) -> PathView:  # the API binds clones of its routers' paths
        cloned = super().clone()
        cloned.__class__ = _MethodCheckingPathView
        return cloned


class ApiRouter(Router):
    """The router of a group of /api/ routes (mounted by api/routes.py). Answers are serialised by
    alias, so a field named by a Python keyword (`pass`) is sent and documented under its name."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(by_alias=True, **kwargs)

    def add_api_operation(self, path: str, methods: list[str], view_func: Any, **kwargs: Any) -> None:
        self.path_operations.setdefault(path, _MethodCheckingPathView())
        super().add_api_operation(path, methods, view_func, **kwargs)


def _blank_is_default(value: Any) -> Any:
    # `?limit=` (an empty value, as a form leaves it) means "not given", as it always has.
    if value == "":
        raise PydanticUseDefault()
    return value


# A query parameter's integer: an empty value takes the default; bounds go in Query(ge=, le=).
QueryInt = Annotated[int, BeforeValidator(_blank_is_default)]
OptionalQueryInt = Annotated[Optional[int], BeforeValidator(_blank_is_default)]


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


def body_too_big() -> HttpResponse:
    return error_response(413, f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes")
