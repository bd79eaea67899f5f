"""RFC 9457 problem+json: errors of every layer as HTTP responses.

Core and store errors know nothing of HTTP: each is a :class:`service.errors.SettlementError`
naming its problem type, and it is answered here, and only here, with that type's status and
title (:mod:`service.problem_types`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from service.app.answers import ProblemDocument
from service.app.effects import PROBLEM_CONTENT_TYPE
from service.errors import SettlementError
from service.http.reply import Reply, to_response
from service.problem_types import PROBLEM_TYPES, problem_type
from service.telemetry import note_problem

__all__ = [
    "IDEMPOTENT",
    "PROBLEM_CONTENT_TYPE",
    "ProblemError",
    "exception_handlers",
    "problem_reply",
    "problem_response",
]

log = logging.getLogger("settlement.http")

# Litestar's detail when a request body could not be read because the client went away.
CLIENT_GONE = "client disconnected prematurely"
# The key, in an idempotent route's handler ``opt``, of its spec (service.http.idempotent).
IDEMPOTENT = "idempotent"


class ProblemError(SettlementError):
    """A refusal of the request that names its problem slug (auth, key, parameters)."""

    def __init__(self, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.slug = slug
        self.problem = slug
        self.detail = detail


def problem_response(
    slug: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> Response[bytes]:
    return to_response(problem_reply(slug, detail, headers=headers, **fields))


def problem_reply(
    slug: str,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **fields: Any,
) -> Reply:
    problem = problem_type(slug)
    status, title = problem.status, problem.title
    note_problem(slug)
    headers = dict(headers) if headers else {}
    if status == 401:  # RFC 9110 section 11.6.1: a 401 names the scheme it wants
        headers["WWW-Authenticate"] = 'Bearer realm="settlement"'
    body = ProblemDocument(
        type=f"/problems/{slug}", title=title, status=status, detail=detail, **fields
    )
    return Reply(status, PROBLEM_CONTENT_TYPE, msgspec.json.encode(body), headers)


def _http_exception(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    if exc.detail == CLIENT_GONE:
        return _layer_error(request, exc)
    match exc:
        case NotFoundException():
            return problem_response("not-found", f"no route or resource at {request.url.path}")
        case MethodNotAllowedException():
            return problem_response(
                "method-not-allowed",
                f"{request.method} is not allowed on {request.url.path}",
                headers=dict(exc.headers or {}),
            )
        case ValidationException():
            return problem_response("validation-error", _validation_detail(exc))
    if exc.status_code == 413:
        return problem_response("payload-too-large", str(exc.detail))
    for problem in PROBLEM_TYPES.values():
        if problem.status == exc.status_code and not problem.business:
            return problem_response(problem.slug, str(exc.detail))
    return problem_response("internal-error", str(exc.detail))


def _validation_detail(exc: ValidationException) -> str:
    extra = exc.extra
    if isinstance(extra, list) and extra:
        first = extra[0]
        if isinstance(first, dict) and (first.get("source"), first.get("key")) == ("body", "data"):
            return "the request has no body: send a JSON document"
        if isinstance(first, dict) and "message" in first:
            return str(first["message"])
    return str(exc.detail)


def _layer_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    if isinstance(exc, ProblemError):
        return problem_response(exc.slug, exc.detail)
    if isinstance(exc, HTTPException) and exc.detail == CLIENT_GONE:
        # the client hung up while its body was read: nothing to answer, nothing broken
        log.info("client disconnected", extra={"path": request.url.path})
        return problem_response("validation-error", "the client disconnected")
    if isinstance(exc, SettlementError) and exc.problem != "internal-error":
        return _settlement_error(exc, exc.problem)  # a bug (internal-error) is logged below
    if isinstance(exc, TimeoutError):  # an await that ran out of time: a dependency is slow
        return _settlement_error(exc, "service-unavailable")
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response("internal-error", "the server failed; the request may be retried")


def _settlement_error(exc: Exception, slug: str) -> Response[bytes]:
    """``exc`` answered as its problem type: a refusal with its message as the detail; a busy
    or unreachable dependency (a type answered with Retry-After) with what to do, its
    message (addresses, pool internals) going to the log."""
    problem = problem_type(slug)
    if not problem.retry_after:
        return problem_response(problem.slug, str(exc))
    log.warning("dependency busy", extra={"slug": problem.slug, "error": repr(exc)[:300]})
    detail = f"{problem.slug.replace('-', ' ')}: a dependency is busy or unreachable; retry"
    return problem_response(problem.slug, detail, headers={"Retry-After": "1"})


def _stamped(
    answer: Callable[[Request[Any, Any, Any], Any], Response[bytes]],
) -> Callable[[Request[Any, Any, Any], Any], Response[bytes]]:
    """``answer``, and on an idempotent route every problem raised (a refusal, 4xx, or a
    failure, 5xx) says it is no replay: no stored answer was sent, so a client can tell it
    from one."""

    def handle(request: Request[Any, Any, Any], exc: Any) -> Response[bytes]:
        response = answer(request, exc)
        route = request.scope.get("route_handler")
        status = response.status_code or 0
        if route is not None and IDEMPOTENT in route.opt and status >= 400:
            response.headers["Idempotent-Replayed"] = "false"
        return response

    return handle


exception_handlers: dict[int | type[Exception], Any] = {
    HTTPException: _stamped(_http_exception),
    HTTP_500_INTERNAL_SERVER_ERROR: _stamped(_layer_error),
    Exception: _stamped(_layer_error),
}
