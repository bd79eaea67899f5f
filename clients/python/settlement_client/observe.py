"""What the client tells the outside: a hook per attempt (for metrics), a DEBUG log line per
retry, and the W3C ``traceparent`` of the caller's current span when OpenTelemetry's API is
installed (an optional import; without it no trace header is sent)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = ["AttemptEvent", "Hook", "log", "trace_headers"]

log = logging.getLogger("settlement_client")

_propagate: Any
try:  # optional: the client depends on httpx and msgspec only
    from opentelemetry import propagate as _propagate
except ImportError:  # pragma: no cover - depends on what is installed
    _propagate = None


class AttemptEvent(msgspec.Struct, frozen=True):
    """One request of one call and what the client decided after it.

    ``status``/``slug`` for an HTTP answer, ``error`` (the exception's class name) for a
    transport error; ``decision`` is ``return``, ``raise`` or ``retry``; ``wait`` the
    seconds slept before the next attempt; ``gave_up`` why a retryable answer was raised
    (attempts, deadline, budget, not-idempotent) or ``final``."""

    method: str
    path: str
    key: str | None
    attempt: int
    status: int | None
    slug: str
    error: str | None
    decision: str
    wait: float
    prefer_wait: int
    gave_up: str
    replayed: bool
    operation_id: str | None
    request_id: str | None
    elapsed: float


Hook = Callable[[AttemptEvent], None]


def trace_headers() -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the current span, when there is one."""
    if _propagate is None:
        return {}
    carrier: dict[str, Any] = {}
    _propagate.inject(carrier)
    return {k: str(v) for k, v in carrier.items()}
