"""Query parameters a route does not declare are refused, not ignored.

Litestar reads the query parameters a handler declares and leaves the others unread, so a
misspelt or guessed name (``?cursor=`` for the work list's ``after``) would silently answer
the first page. :func:`refuse_undeclared_query` makes it a 400 that names what the route
takes; handlers call it after authentication, so credentials are still judged first.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.handlers import BaseRouteHandler
from litestar.params import QueryParameter

from service.http.problems import ProblemError

__all__ = ["refuse_undeclared_query"]

_declared: dict[str, frozenset[str]] = {}


def _names(handler: BaseRouteHandler) -> frozenset[str]:
    """The query parameters ``handler`` declares, by the names a client sends."""
    found = _declared.get(handler.handler_id)
    if found is None:
        names = set()
        for name, field in handler.parsed_fn_signature.parameters.items():
            kwarg = field.kwarg_definition
            if isinstance(kwarg, QueryParameter):
                names.add(kwarg.query or kwarg.name or name)
        found = _declared[handler.handler_id] = frozenset(names)
    return found


def refuse_undeclared_query(request: Request[Any, Any, Any]) -> None:
    """A ``validation-error`` for the first query parameter the route does not take."""
    if not request.query_params:
        return
    names = _names(request.route_handler)
    unknown = sorted(set(request.query_params) - names)
    if unknown:
        takes = ", ".join(sorted(names)) or "none"
        raise ProblemError(
            "validation-error",
            f"unknown query parameter {unknown[0][:64]!r}; this route takes: {takes}",
        )
