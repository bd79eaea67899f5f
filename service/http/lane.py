"""The idempotent routes' own lane: a POST to one of them goes straight to its answer.

Litestar routes a request, resolves its dependencies, wraps the handler in its exception
middleware, builds a ``Request`` (its headers as a multidict) and turns the returned
``Response`` into ASGI messages. The idempotent routes need none of it: a fixed path, no
dependency injection (their answer takes the request and the process's ``Settlement``), two
header lookups and the body. So this lane calls the route's answer function
(``answer_transfer`` and the like, which the Litestar handler calls too) with a request of its
own (:class:`_LaneCall`: the headers of the scope, the body within the limit Litestar
registered for the route, Litestar's own 400, 413 and disconnect exceptions) and sends the
:class:`~service.http.reply.Reply` as the two ASGI messages Litestar would send, header for
header. An exception goes to the app's exception table, looked up as Litestar's exception
middleware does, with a Litestar ``Request``.

Measured in process (the app over ASGI, no HTTP server): a replay cost 0.38 ms of CPU through
Litestar's router, 0.24-0.27 ms with a lane that still built Litestar's ``Request`` and
``Response``, and 0.19-0.21 ms with this request and reply of its own (458 -> 356 Python
calls; a new transfer 1,030 -> 928). Every other request, any method but POST, and a request
whose Host header Litestar's router would refuse go to Litestar unchanged;
``tests/integration/test_lane.py`` holds the two ways to the same answers.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from inspect import getmro
from typing import Any

from litestar import Litestar, Request, Response
from litestar._asgi.utils import is_valid_host
from litestar.exceptions import ClientException, HTTPException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from service.http.problems import CLIENT_GONE, exception_handlers
from service.http.reply import LANE_ANSWER, Call, Reply, send_reply

__all__ = ["IdempotentLane", "RouteAnswer"]

# an idempotent route's answer: (request, the process's Settlement) -> its reply
RouteAnswer = Callable[[Call, Any], Awaitable[Reply]]


class _Route:
    __slots__ = ("answer", "handler", "limit")

    def __init__(self, handler: HTTPRouteHandler, answer: RouteAnswer) -> None:
        self.handler = handler
        self.answer = answer
        self.limit: float = handler.resolve_request_max_body_size() or math.inf


class IdempotentLane:
    """Litestar's ``inner`` ASGI handler (its exception middleware and router) with a lane for
    the POST routes of ``app`` at ``paths``: each calls the answer its handler names in its
    ``opt`` (:data:`~service.http.reply.LANE_ANSWER`); ``settlement`` gives the process's
    Settlement (what Litestar's dependency would inject). It runs inside
    ``Litestar.__call__``, which has put the app in the scope."""

    def __init__(
        self,
        app: Litestar,
        inner: Callable[[Any, Any, Any], Awaitable[None]],
        paths: list[str],
        settlement: Callable[[], Any],
    ) -> None:
        self._app = inner
        self._settlement = settlement
        self._routes: dict[str, _Route] = {}
        for route in app.routes:
            if route.path in paths and isinstance(route, HTTPRoute):
                handler = _registered(route)
                if handler is not None and callable(handler.opt.get(LANE_ANSWER)):
                    self._routes[route.path] = _Route(handler, handler.opt[LANE_ANSWER])
        missing = set(paths) - set(self._routes)
        if missing:
            raise ValueError(f"no POST route with a {LANE_ANSWER} at {sorted(missing)}")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self._routes.get(scope["path"])
            if route is not None and not scope.get("root_path") and _valid_host(scope):
                await self._handle(route, scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def _handle(self, route: _Route, scope: Any, receive: Any, send: Any) -> None:
        # what Litestar's router puts in the scope: the metrics' route label reads path_template
        scope["route_handler"] = route.handler
        scope["path_params"] = {}
        scope["path_template"] = scope["path"]
        try:
            reply = await route.answer(_LaneCall(scope, receive, route.limit), self._settlement())
        except Exception as exc:
            request: Request[Any, Any, Any] = Request(scope, receive, send)
            answer = _answer_for(request, exc).to_asgi_response(app=None, request=request)
            await answer(scope, receive, send)
            return
        await send_reply(reply, send)


class _Headers:
    """A request's headers as Litestar's ``Headers`` reads them (latin-1, names
    case-insensitive, the first value for ``get``), indexed on first use."""

    __slots__ = ("_by_name", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._by_name: dict[bytes, list[bytes]] | None = None

    def _values(self, key: str) -> list[bytes] | None:
        by_name = self._by_name
        if by_name is None:
            by_name = self._by_name = {}
            for name, value in self._raw:
                by_name.setdefault(name.lower(), []).append(value)
        return by_name.get(key.lower().encode("latin-1"))

    def get(self, key: str, /) -> str | None:
        values = self._values(key)
        return None if values is None else values[0].decode("latin-1")

    def getall(self, key: str, default: list[str], /) -> list[str]:
        values = self._values(key)
        return default if values is None else [v.decode("latin-1") for v in values]


class _LaneCall:
    """The request of a POST in the lane: its headers, and its body read as Litestar's
    ``Request.body`` reads it, with the same exceptions."""

    __slots__ = ("_limit", "_receive", "headers")

    def __init__(self, scope: Any, receive: Callable[[], Awaitable[Any]], limit: float) -> None:
        self.headers = _Headers(scope["headers"])
        self._receive = receive
        self._limit = limit

    async def body(self) -> bytes:
        announced = self.headers.get("content-length")
        if announced is not None:
            try:
                length = int(announced)
            except ValueError:
                raise ClientException(f"Invalid content-length: {announced!r}") from None
            if length > self._limit:
                raise RequestEntityTooLarge
        chunks: list[bytes] = []
        total = 0
        while True:
            event = await self._receive()
            if event["type"] == "http.request":
                chunk = event.get("body", b"")
                if chunk:
                    total += len(chunk)
                    if total > self._limit:
                        raise RequestEntityTooLarge
                    chunks.append(chunk)
                if not event.get("more_body", False):
                    return b"".join(chunks)
            elif event["type"] == "http.disconnect":
                raise InternalServerException(CLIENT_GONE)


def _valid_host(scope: Any) -> bool:
    """Litestar's router answers a request with a malformed Host header 400; the lane leaves
    such a request to it."""
    for name, value in scope["headers"]:
        if name == b"host":
            return is_valid_host(value)
    return True


def _registered(route: HTTPRoute) -> HTTPRouteHandler | None:
    """The route's POST handler as Litestar registered it (with the app's body limit)."""
    entry = route.route_handler_map.get("POST")
    handler = entry[0] if isinstance(entry, tuple) else entry
    return handler if isinstance(handler, HTTPRouteHandler) else None


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
