"""Traces: the OpenTelemetry SDK behind one small interface, or nothing at all.

``SETTLEMENT_OTEL_EXPORTER=none`` (the default) builds no tracer provider, patches no
library and imports nothing of the SDK's tracing: :func:`span` then returns one shared
object whose methods do nothing, so the code that calls it pays a function call.
``console`` prints each finished span as JSON on stdout; ``otlp`` sends them with the
OTLP/HTTP exporter (the ``otlp`` extra, configured by the standard ``OTEL_EXPORTER_OTLP_*``
variables). Either also instruments asyncpg (every SQL statement, SQLAlchemy's too), Redis
and httpx (the provider and feed clients) when their instrumentation packages are installed.

Attribute names are given as keywords; the first ``_`` of a name stands for a dot
(``operation_id`` is ``operation.id``, ``attempt_number`` is ``attempt.number``).
"""

from __future__ import annotations

import logging
import os
from types import TracebackType
from typing import TYPE_CHECKING, Any

from service.config import ConfigError

if TYPE_CHECKING:
    from opentelemetry.context import Context

__all__ = [
    "OTLP_PACKAGE",
    "ServerSpan",
    "Span",
    "configure_tracing",
    "require_exporter",
    "server_span",
    "span",
    "tracing_enabled",
]

log = logging.getLogger("settlement.telemetry")

OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
_OTLP_INSTALL = "pip install 'settlement[otlp]'"

_tracer: Any = None  # an opentelemetry Tracer once tracing is configured


class Span:
    """What :func:`span` yields: ``set`` adds attributes to the span (when there is one)."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def set(self, **attributes: Any) -> None:
        return None


_NO_SPAN = Span()


class _RealSpan(Span):
    __slots__ = ("_manager", "_span")

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self._manager = _tracer.start_as_current_span(name, attributes=_attributes(attributes))
        self._span: Any = None

    def __enter__(self) -> Span:
        self._span = self._manager.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._manager.__exit__(exc_type, exc, tb)

    def set(self, **attributes: Any) -> None:
        if self._span is not None:
            self._span.set_attributes(_attributes(attributes))


def span(name: str, **attributes: Any) -> Span:
    """A child span of the current one, as a context manager; a no-op when tracing is off."""
    if _tracer is None:
        return _NO_SPAN
    return _RealSpan(name, attributes)


def tracing_enabled() -> bool:
    return _tracer is not None


def _attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k.replace("_", ".", 1): v for k, v in attributes.items() if v is not None}


class ServerSpan:
    """The span of one HTTP request, current while the request is served."""

    __slots__ = ("_span", "_token", "trace_id")

    def __init__(self, method: str, parent: Context | None) -> None:
        from opentelemetry import context, trace

        self._span = _tracer.start_span(method, context=parent, kind=trace.SpanKind.SERVER)
        self._token = context.attach(trace.set_span_in_context(self._span))
        self.trace_id = format(self._span.get_span_context().trace_id, "032x")

    def finish(self, method: str, route: str | None, status: int, **attributes: Any) -> None:
        from opentelemetry import context, trace

        span = self._span
        if route is not None:
            span.update_name(f"{method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.request.method", method)
        span.set_attribute("http.response.status_code", status)
        span.set_attributes(_attributes(attributes))
        if status >= 500:
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end()
        context.detach(self._token)


def server_span(method: str, parent: Context | None) -> ServerSpan | None:
    """The request's span, a child of ``parent`` (the caller's trace context from its
    ``traceparent`` and ``tracestate``, :func:`service.telemetry.context.incoming_trace`),
    or None when tracing is off."""
    if _tracer is None:
        return None
    return ServerSpan(method, parent)


def require_exporter(exporter: str) -> None:
    """Refuse at start an exporter whose package is not installed."""
    if exporter != "otlp":
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"SETTLEMENT_OTEL_EXPORTER=otlp needs the package {OTLP_PACKAGE}, which is not "
            f"installed; run: {_OTLP_INSTALL}"
        ) from None


def configure_tracing(exporter: str, *, service_name: str = "settlement") -> None:
    """Set up this process's tracer provider for ``exporter`` (once); ``none`` does nothing."""
    global _tracer
    if exporter == "none" or _tracer is not None:
        return
    require_exporter(exporter)
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    span_exporter: SpanExporter
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()
    elif exporter == "console":
        span_exporter = ConsoleSpanExporter(service_name=service_name)
    else:
        raise ConfigError(f"SETTLEMENT_OTEL_EXPORTER must be none, console or otlp: {exporter!r}")
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": service_name, "service.instance.id": str(os.getpid())}
        )
    )
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    _instrument_libraries(provider)
    _tracer = provider.get_tracer("settlement")


def flush_tracing() -> None:
    """Export the spans still batched, now: a server's worker may end without running atexit
    hooks (granian's forked workers end with ``os._exit``), which is where the SDK would."""
    if _tracer is None:
        return
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        flush()


def _instrument_libraries(provider: Any) -> None:
    """Client spans for SQL (asyncpg, under SQLAlchemy too), Redis and httpx, where the
    instrumentation package is installed."""
    missing = []
    try:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

        AsyncPGInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    except ImportError:
        missing.append("opentelemetry-instrumentation-asyncpg")
    try:
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument(tracer_provider=provider)
    except ImportError:
        missing.append("opentelemetry-instrumentation-redis")
    try:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument(tracer_provider=provider)
    except ImportError:
        missing.append("opentelemetry-instrumentation-httpx")
    if missing:
        log.warning("tracing without client spans", extra={"missing": missing})
