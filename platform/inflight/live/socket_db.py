"""The socket side's database calls, off Channels' one shared thread.

Channels runs a consumer's `database_sync_to_async` calls thread-sensitively, and outside a request
(Django gives each HTTP request a thread of its own; Channels gives a socket none) that means on
one thread per process: every page's handshake — its session and user (`AuthMiddleware`), then
whether it may see the run and the run's status (`live.consumers.RunConsumer`) — waited in one
queue. A burst of pages opening (a node restarted, 500 pages reconnecting) took longer than
Daphne's 5 s handshake limit and pages were dropped before their socket opened (bench/platform_scale.py:
40 live runs and 1,500 pages, 14,605 failed handshakes with one web process). These calls read
only; each runs on a thread of the event loop's pool and gives its (pooled) connection back after.
"""

from __future__ import annotations

from typing import Any, Callable, Coroutine, TypeVar

from channels.auth import AuthMiddleware, get_user
from channels.db import DatabaseSyncToAsync
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.db import connections

T = TypeVar("T")


class _SocketDatabaseCall(DatabaseSyncToAsync):
    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            # Back to the web node's pool; without a pool (INFLIGHT_DB_POOL=0, the tests) a thread of
            # the loop's pool must not keep one open for ever (nobody else closes it).
            connections.close_all()


def socket_db(func: Callable[..., T]) -> Callable[..., Coroutine[Any, Any, T]]:
    """`func` (reads the database) as a coroutine function run on the loop's thread pool, its
    connection given back when it returns."""
    return _SocketDatabaseCall(func, thread_sensitive=False)


_get_user = socket_db(get_user.func)  # Channels' own lookup (session, then user), off the shared thread


class SocketAuthMiddleware(AuthMiddleware):
    """Channels' `AuthMiddleware` (`scope["user"]` from the session) with its lookup on the pool."""

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        scope["user"]._wrapped = await _get_user(scope)


def socket_auth_stack(inner: Any) -> Any:
    """As Channels' `AuthMiddlewareStack`: cookies, then the session, then the user."""
    return CookieMiddleware(SessionMiddleware(SocketAuthMiddleware(inner)))
