"""Guards: what Litestar checks before it reads a request's body, in the order a client fixes
its mistakes: credentials (401), role (403), then the body's media type (415).

A handler with a typed body (``data: JSONBody[...]``, decoded by
:class:`~service.http.bodies.StrictJson`) has Litestar read and decode the body before the
handler runs; these guards run before that, so a caller without credentials learns nothing
about what a good body would be, and a body that does not say it is JSON is refused before a
byte of it is read. The caller is kept in the request's state (:func:`caller_of`).
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler
from litestar.types import Guard

from service.domain.principals import Principal, Role
from service.http.auth import authenticate, require_role
from service.http.bodies import check_json_content_type
from service.http.deps import settlement_of

__all__ = ["caller", "caller_of"]


def caller(*roles: Role, body: bool = False) -> Guard:
    """A guard admitting a caller with one of ``roles``; ``body``: the route takes a JSON
    body, whose media type is checked after the caller."""

    async def guard(
        connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
    ) -> None:
        principal = await authenticate(connection, settlement_of(connection).principals)
        require_role(principal, *roles)
        if body:
            check_json_content_type(connection.headers.get("content-type"))
        connection.state.caller = principal

    return guard


def caller_of(request: Request[Any, Any, Any]) -> Principal:
    """The caller a :func:`caller` guard admitted."""
    principal: Principal = request.state.caller
    return principal
