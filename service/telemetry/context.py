"""What is known about the request being served, for its log lines and its answer.

The request middleware (:mod:`service.telemetry.asgi`) puts one :class:`RequestContext` in a
context variable for the request's task; code below it adds what it learns (the operation,
the attempt, the problem slug answered) with :func:`annotate` and :func:`note_problem`. Tasks
started by the request copy the context, so they share the same object. Outside a request
(the sweeper, the purge) there is none and both calls do nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

from opentelemetry.context import Context
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "REQUEST_ID_MAX",
    "IncomingTrace",
    "RequestContext",
    "annotate",
    "current",
    "incoming_trace",
    "log_fields",
    "new_request_id",
    "note_problem",
    "sane_request_id",
    "trace_id_of",
]

# An incoming Request-Id is echoed in a header and written to every log line of its request:
# at most this long, and only characters that need no quoting anywhere.
REQUEST_ID_MAX = 128
_SANE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,%d}" % REQUEST_ID_MAX)


class RequestContext:
    """One request's identifiers; ``None`` until known."""

    __slots__ = ("attempt", "operation_id", "problem", "request_id", "trace_id")

    def __init__(self, request_id: str, trace_id: str | None = None) -> None:
        self.request_id = request_id
        self.trace_id = trace_id
        self.operation_id: str | None = None
        self.attempt: int | None = None
        self.problem: str | None = None  # the slug of the problem document answered


_CURRENT: ContextVar[RequestContext | None] = ContextVar("settlement_request", default=None)


def current() -> RequestContext | None:
    return _CURRENT.get()


def bind(context: RequestContext) -> Any:
    """Make ``context`` the current request's; returns the token for :func:`unbind`."""
    return _CURRENT.set(context)


def unbind(token: Any) -> None:
    _CURRENT.reset(token)


def annotate(*, operation_id: str | None = None, attempt: int | None = None) -> None:
    """The request now works on ``operation_id`` (as attempt number ``attempt``)."""
    context = _CURRENT.get()
    if context is None:
        return
    if operation_id is not None:
        context.operation_id = operation_id
    if attempt is not None:
        context.attempt = attempt


def note_problem(slug: str) -> None:
    """The request is answered with the problem document ``slug`` (for the metrics)."""
    context = _CURRENT.get()
    if context is not None:
        context.problem = slug


def log_fields() -> dict[str, Any]:
    """The current request's identifiers that are known, for a log line."""
    context = _CURRENT.get()
    if context is None:
        return {}
    fields: dict[str, Any] = {"request_id": context.request_id}
    if context.trace_id is not None:
        fields["trace_id"] = context.trace_id
    if context.operation_id is not None:
        fields["operation_id"] = context.operation_id
    if context.attempt is not None:
        fields["attempt"] = context.attempt
    return fields


class IncomingTrace(NamedTuple):
    """The caller's trace, from its W3C ``traceparent`` and ``tracestate`` headers."""

    context: Context  # an OpenTelemetry context whose current span is the caller's
    trace_id: str


# The W3C Trace Context propagator, whatever OTEL_PROPAGATORS says: these two headers are
# what the Request-Id and the server span join.
_PROPAGATOR = TraceContextTextMapPropagator()


def incoming_trace(
    traceparent: bytes | None, tracestate: Sequence[bytes] = ()
) -> IncomingTrace | None:
    """The caller's trace context (its ``tracestate`` kept, for the spans below and the
    calls they make) when ``traceparent`` is valid, else None."""
    if not traceparent:
        return None
    carrier: dict[str, str | list[str]] = {"traceparent": traceparent.decode("latin-1")}
    if tracestate:
        carrier["tracestate"] = [value.decode("latin-1") for value in tracestate]
    context = _PROPAGATOR.extract(carrier)
    parent = get_current_span(context).get_span_context()
    if not parent.is_valid:
        return None
    return IncomingTrace(context, format(parent.trace_id, "032x"))


def trace_id_of(traceparent: bytes | None) -> str | None:
    """The trace id of a valid W3C ``traceparent`` header value, else None."""
    incoming = incoming_trace(traceparent)
    return None if incoming is None else incoming.trace_id


def sane_request_id(value: bytes | None) -> str | None:
    """An incoming ``Request-Id`` worth keeping (bounded, safe characters), else None."""
    if value is None or _SANE_REQUEST_ID.fullmatch(value) is None:
        return None
    return value.decode()


def new_request_id() -> str:
    """A fresh request id: 128 random bits in hex, the shape of a trace id."""
    return os.urandom(16).hex()
