"""Telemetry: traces, metrics, and the request context of log lines. Only this package
imports OpenTelemetry and prometheus_client; the rest of the service calls these small hooks.

* :func:`span` — a child span (a no-op object when ``SETTLEMENT_OTEL_EXPORTER=none``);
* :class:`Metrics` — the process's instruments and their hooks, Prometheus text summed over
  the server's workers by prometheus_client's multiprocess mode
  (:mod:`service.telemetry.metrics`);
* :func:`annotate`, :func:`note_problem` — what the current request learned, for its logs,
  span and metrics; :func:`log_fields` — those fields for a log line;
* :class:`RequestTelemetry` — the ASGI wrapper that sets all of that up per request.
"""

from service.telemetry.asgi import RequestTelemetry
from service.telemetry.context import annotate, log_fields, note_problem
from service.telemetry.metrics import Metrics
from service.telemetry.tracing import (
    Span,
    configure_tracing,
    flush_tracing,
    require_exporter,
    span,
    tracing_enabled,
)

__all__ = [
    "Metrics",
    "RequestTelemetry",
    "Span",
    "annotate",
    "configure_tracing",
    "flush_tracing",
    "log_fields",
    "note_problem",
    "require_exporter",
    "span",
    "tracing_enabled",
]
