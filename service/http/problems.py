"""RFC 9457 problem+json: the one table from errors of every layer to HTTP responses.

Core and store errors know nothing of HTTP; they are mapped here, and only here.
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
from service.http.reply import Reply, to_response
from service.leases import LeaseUnavailable
from service.store.db import DATABASE_GONE, PoolTimeout, database_gone
from service.store.principals import PrincipalExists
from service.store.settlement import OperationNotFound, RowLocked, SettlementContention
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


# slug -> (status, title). docs/design.md §6 is the contract; slugs and statuses are public API.
SLUGS: dict[str, tuple[int, str]] = {
    "unauthenticated": (401, "Authentication required"),
    "forbidden": (403, "Forbidden"),
    "validation-error": (400, "Invalid request"),
    "idempotency-key-missing": (400, "Idempotency-Key header missing"),
    "idempotency-key-invalid": (400, "Idempotency-Key header invalid"),
    "fingerprint-mismatch": (422, "Idempotency key reused with a different request"),
    "binding-mismatch": (409, "Reservation bound to another credential"),
    "operation-in-progress": (409, "Operation in progress"),
    "operation-conflict": (409, "Operation outcome in conflict"),
    "operation-superseded": (409, "Operation superseded while this attempt ran"),
    "operation-outcome-unknown": (504, "Operation outcome unknown"),
    "effect-refused": (409, "Effect refused by a database constraint"),
    "idempotency-key-expired": (410, "Idempotency key expired"),
    "lease-unavailable": (503, "Lease store unavailable"),
    "not-found": (404, "Not found"),
    "method-not-allowed": (405, "Method not allowed"),
    "payload-too-large": (413, "Payload too large"),
    "request-timeout": (408, "Request body too slow"),
    "unsupported-media-type": (415, "Unsupported media type"),
    "too-many-requests": (429, "Too many requests running for this principal"),
    "invalid-evidence": (422, "Evidence signature does not verify"),
    "evidence-quota-exceeded": (429, "Too much of this observer's evidence was quarantined"),
    "service-unavailable": (503, "Service unavailable"),
    "principal-exists": (409, "Principal exists"),
    "principal-limit": (409, "The tenant holds as many principals as it may"),
    "supersede-needs-force": (409, "Superseding a completed operation needs force"),
    "conflict-in-one-page": (409, "An event twice in one page is for the source to fix"),
    "internal-error": (500, "Internal server error"),
}


class ProblemError(Exception):
    """An HTTP-layer refusal that names its problem slug (auth, key, parameters)."""

    def __init__(self, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail


# exception type -> (slug, answer with Retry-After), for errors raised below the HTTP layer;
# the first matching type wins
ERROR_SLUGS: dict[type[BaseException], tuple[str, bool]] = {
    OperationNotFound: ("not-found", False),
    PrincipalExists: ("principal-exists", False),
    SettlementContention: ("service-unavailable", True),
    # a row lock not granted within the lock timeout: another phase holds the operation
    RowLocked: ("operation-in-progress", True),
    LeaseUnavailable: ("lease-unavailable", True),
    # no pooled database connection within the connect timeout (SQLAlchemy's, asyncpg's)
    PoolTimeout: ("service-unavailable", True),
    TimeoutError: ("service-unavailable", True),
    # the database went away (a restart, a dropped connection): retry with the same key
    **dict.fromkeys(DATABASE_GONE, ("service-unavailable", True)),
}


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
    status, title = SLUGS[slug]
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
    for slug, (status, _) in SLUGS.items():
        if status == exc.status_code:
            return problem_response(slug, str(exc.detail))
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
    for kind, (slug, retry) in ERROR_SLUGS.items():
        if isinstance(exc, kind):
            if not retry:  # a refusal about the request itself: its message is the answer
                return problem_response(slug, str(exc))
            # a busy or unreachable dependency: its message (addresses, pool internals) goes
            # to the log, the client gets what to do
            log.warning("dependency busy", extra={"slug": slug, "error": repr(exc)})
            detail = f"{slug.replace('-', ' ')}: a dependency is busy or unreachable; retry"
            return problem_response(slug, detail, headers={"Retry-After": "1"})
    if database_gone(exc):  # wrapped where the table above cannot see it
        log.warning("database unreachable", extra={"error": repr(exc)[:300]})
        detail = "service unavailable: the database is unreachable; retry with the same key"
        return problem_response("service-unavailable", detail, headers={"Retry-After": "1"})
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response("internal-error", "the server failed; the request may be retried")


def _stamped(
    answer: Callable[[Request[Any, Any, Any], Any], Response[bytes]],
) -> Callable[[Request[Any, Any, Any], Any], Response[bytes]]:
    """``answer``, and on an idempotent route a refusal (4xx) says it is no replay: the request
    was refused before any operation was looked at, so a client can tell it from a stored
    answer."""

    def handle(request: Request[Any, Any, Any], exc: Any) -> Response[bytes]:
        response = answer(request, exc)
        route = request.scope.get("route_handler")
        status = response.status_code or 0
        if route is not None and IDEMPOTENT in route.opt and 400 <= status < 500:
            response.headers["Idempotent-Replayed"] = "false"
        return response

    return handle


exception_handlers: dict[int | type[Exception], Any] = {
    HTTPException: _stamped(_http_exception),
    HTTP_500_INTERNAL_SERVER_ERROR: _stamped(_layer_error),
    Exception: _stamped(_layer_error),
}
