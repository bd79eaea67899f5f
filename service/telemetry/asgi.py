"""Around every HTTP request: its Request-Id, its log context, its span, its metrics and its
access line. A plain ASGI wrapper (no web framework imported here), put around the
application's handler, so 404s and every problem answer pass through it too.

The caller's trace: its W3C ``traceparent`` and ``tracestate``, read by OpenTelemetry's
TraceContext propagator; the request span is its child and keeps the ``tracestate``.

Request-Id: the trace id of a valid incoming W3C ``traceparent``; else a sane incoming
``Request-Id`` (at most 128 characters of ``A-Za-z0-9._:/+=@-``); else, with tracing on, the
request span's trace id; else 128 random bits in hex. Every response carries it.

The problem slug of an answer (its metrics, access line and span) is read here from what the
answer carries, and only here: a ``problem+json`` answer's status and its body's ``type``.
A refusal answered now (a 409, a 422, a 503), a business refusal stored as an operation's
``failed`` outcome (``insufficient-funds``, ``payout-declined``) and every replay of one are
counted alike, once per answer sent (a replay is also counted as one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import msgspec

from service.problem_types import PROBLEM_TYPES
from service.telemetry import context as request_context
from service.telemetry.metrics import Metrics
from service.telemetry.tracing import server_span

__all__ = ["OTHER_PROBLEM", "RequestTelemetry", "problem_slug"]

access = logging.getLogger("settlement.access")

# ASGI, loosely typed: this wraps any framework's application
Scope = Any
Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

# The route label of a request no route matched: the path is the client's, not ours, so it
# never becomes a label (unbounded series).
UNMATCHED = "unmatched"
# The content type of a problem document (RFC 9457), whose body's type names its slug.
PROBLEM_MEDIA_TYPE = b"application/problem+json"
# The slug label of a problem document whose type is none of ours (a provider's own, stored
# as an outcome): the label's values stay the declared slugs and this one.
OTHER_PROBLEM = "other"
# About the most of a problem document's body kept to read its type: ours are under 1 KiB; a
# longer one (a provider's, stored as an outcome) is cut there and counted as OTHER_PROBLEM.
MAX_PROBLEM_BODY = 64 * 1024


class RequestTelemetry:
    """``app`` with request telemetry, counted in ``metrics``."""

    def __init__(self, app: ASGIApp, metrics: Metrics, *, access_log: bool) -> None:
        self._app = app
        self._metrics = metrics
        self._access_log = access_log

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        traceparent = incoming = None
        tracestate: list[bytes] = []
        for name, value in scope["headers"]:
            if name == b"traceparent":
                traceparent = value
            elif name == b"tracestate":
                tracestate.append(value)
            elif name == b"request-id":
                incoming = value
        caller = request_context.incoming_trace(traceparent, tracestate)
        trace_id = None if caller is None else caller.trace_id
        method: str = scope["method"]
        span = server_span(method, None if caller is None else caller.context)
        if span is not None:
            trace_id = span.trace_id
        request_id = (
            trace_id
            or request_context.sane_request_id(incoming)
            or request_context.new_request_id()
        )
        ctx = request_context.RequestContext(request_id, trace_id)
        token = request_context.bind(ctx)
        header = (b"request-id", request_id.encode())
        status = 500
        replayed = False
        answered = False
        problem_body: bytearray | None = None  # a problem+json answer's body, as sent

        def answer() -> None:
            """Count the answer and write its access line: before its last byte is sent, so
            a scrape or a log reader that follows the answer finds both."""
            nonlocal answered
            answered = True
            if problem_body is not None:
                ctx.problem = problem_slug(bytes(problem_body))
            template = scope.get("path_template")
            route = f"{method} {template}" if template else UNMATCHED
            seconds = time.perf_counter() - started
            self._metrics.on_request(route, status, ctx.problem, replayed, seconds)
            if self._access_log:
                fields = {
                    "request_id": request_id,
                    "trace_id": trace_id,
                    "operation_id": ctx.operation_id,
                    "attempt": ctx.attempt,
                    "method": method,
                    "path": scope.get("path"),
                    "route": route,
                    "status": status,
                    "problem": ctx.problem,
                    "replayed": replayed,
                    "duration_ms": round(seconds * 1000, 3),
                    "client": _client(scope),
                }
                access.info("request", extra={k: v for k, v in fields.items() if v is not None})

        async def send_with_id(message: Message) -> None:
            nonlocal status, replayed, problem_body
            if message["type"] == "http.response.body":
                if problem_body is not None and len(problem_body) < MAX_PROBLEM_BODY:
                    problem_body += message.get("body", b"")
                if not message.get("more_body"):
                    answer()
            elif message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers") or ())
                for name, value in headers:
                    if name == b"idempotent-replayed":
                        replayed = value == b"true"
                    elif name == b"content-type":
                        media_type = value.partition(b";")[0].strip().lower()
                        problem_body = bytearray() if media_type == PROBLEM_MEDIA_TYPE else None
                    elif name == b"operation-id" and ctx.operation_id is None:
                        ctx.operation_id = value.decode("latin-1")
                headers.append(header)
                message["headers"] = headers
            await send(message)

        try:
            await self._app(scope, receive, send_with_id)
        finally:
            request_context.unbind(token)
            if not answered:  # no complete answer was sent
                answer()
            if span is not None:
                span.finish(
                    method,
                    scope.get("path_template"),
                    status,
                    operation_id=ctx.operation_id,
                    attempt_number=ctx.attempt,
                    replayed=replayed,
                    problem=ctx.problem,
                )


class _Typed(msgspec.Struct):
    type: str = ""


def problem_slug(body: bytes) -> str:
    """The slug of the problem document ``body``: its ``type`` ``/problems/<slug>`` of a
    declared slug, else :data:`OTHER_PROBLEM` (no type, another's type, not JSON)."""
    try:
        kind = msgspec.json.decode(body, type=_Typed).type
    except msgspec.DecodeError:
        return OTHER_PROBLEM
    slug = kind.removeprefix("/problems/")
    return slug if slug != kind and slug in PROBLEM_TYPES else OTHER_PROBLEM


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return None if not client else f"{client[0]}:{client[1]}"
