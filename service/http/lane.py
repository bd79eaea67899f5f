"""The idempotent routes' own lane: a POST to one of them goes straight to its handler.

Litestar routes a request, resolves its dependencies, wraps the handler in its exception
middleware and turns the returned ``Response`` into ASGI messages: 111 of the 568 Python calls
of a replay, profiled in process. The idempotent routes need none of its routing (a fixed
path), nor its dependency injection (the handler takes the request and the process's
``Settlement``), so this lane calls the handler Litestar registered, with the same Litestar
``Request`` (its body limit, its headers) and the same exception table
(:mod:`service.http.problems`), and sends the ``Response`` the way Litestar does
(``to_asgi_response``): 59 of Litestar's calls remain, and a replay went from 0.38 to 0.30 ms
of CPU in that measurement. Every other request, any method but POST, and a request whose
Host header Litestar's router would refuse go to Litestar unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from inspect import getmro
from typing import Any

from litestar import Litestar, Request, Response
from litestar._asgi.utils import is_valid_host
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from service.http.problems import exception_handlers

__all__ = ["IdempotentLane"]

# the parameters of a handler this lane can call without Litestar's dependency injection
_PLAIN = ["request", "settlement"]


class IdempotentLane:
    """Litestar's ``inner`` ASGI handler (its exception middleware and router) with a lane for
    the POST routes of ``app`` at ``paths``; ``settlement`` gives the process's Settlement
    (what Litestar's dependency would inject). It runs inside ``Litestar.__call__``, which
    has put the app in the scope."""

    def __init__(
        self,
        app: Litestar,
        inner: Callable[[Any, Any, Any], Awaitable[None]],
        paths: list[str],
        settlement: Callable[[], Any],
    ) -> None:
        self._app = inner
        self._settlement = settlement
        self._handlers: dict[str, HTTPRouteHandler] = {}
        for route in app.routes:
            if route.path in paths and isinstance(route, HTTPRoute):
                handler = _registered(route)
                if list(inspect.signature(handler.fn).parameters) != _PLAIN:
                    raise TypeError(
                        f"{route.path}: the lane calls handlers of (request, settlement)"
                    )
                self._handlers[route.path] = handler
        missing = set(paths) - set(self._handlers)
        if missing:
            raise ValueError(f"no POST route at {sorted(missing)}")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._handlers.get(scope["path"])
            if handler is not None and not scope.get("root_path") and _valid_host(scope):
                await self._handle(handler, scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def _handle(self, handler: HTTPRouteHandler, scope: Any, receive: Any, send: Any) -> None:
        # what Litestar's router puts in the scope: the metrics' route label reads path_template
        scope["route_handler"] = handler
        scope["path_params"] = {}
        scope["path_template"] = scope["path"]
        request: Request[Any, Any, Any] = Request(scope, receive, send)
        try:
            response = await handler.fn(request=request, settlement=self._settlement())
            answer = response.to_asgi_response(app=None, request=request)
        except Exception as exc:
            answer = _answer_for(request, exc).to_asgi_response(app=None, request=request)
        await answer(scope, receive, send)


def _valid_host(scope: Any) -> bool:
    """Litestar's router answers a request with a malformed Host header 400; the lane leaves
    such a request to it."""
    for name, value in scope["headers"]:
        if name == b"host":
            return is_valid_host(value)
    return True


def _registered(route: HTTPRoute) -> HTTPRouteHandler:
    """The route's POST handler as Litestar registered it (with the app's body limit)."""
    entry = route.route_handler_map["POST"]
    handler = entry[0] if isinstance(entry, tuple) else entry
    assert isinstance(handler, HTTPRouteHandler)
    return handler


def _answer_for(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """The app's table, looked up as Litestar's exception middleware does: an HTTPException
    by its status code first, then every exception by its classes, else the 500 handler."""
    handler = None
    if isinstance(exc, HTTPException):
        handler = exception_handlers.get(exc.status_code)
    if handler is None:
        found = (exception_handlers[cls] for cls in getmro(type(exc)) if cls in exception_handlers)
        handler = next(found, exception_handlers[HTTP_500_INTERNAL_SERVER_ERROR])
    answer: Response[Any] = handler(request, exc)
    return answer
