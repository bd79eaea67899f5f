"""The Litestar application factory: routes, problem mapping, and the composition root.

The lifespan opens one :class:`~service.app.root.Settlement` per process; route handlers
receive it by dependency injection (parameter ``settlement``) and only call its use cases.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from service.app.root import Settlement, require_endpoints
from service.config import Settings
from service.http.console import ConsoleHeaders, console_router, template_config
from service.http.health import health, livez, metrics, readyz
from service.http.idempotent import idempotent_handlers
from service.http.limits import BodyDeadline
from service.http.openapi_plugins import openapi_config
from service.http.pages import problem_page
from service.http.problems import exception_handlers
from service.http.routes.admin import (
    create_principal,
    list_work,
    resolve_operation,
    revoke_principal,
    rotate_principal,
    supersede_operation,
)
from service.http.routes.feeds import (
    accept_conflict,
    decide_hold,
    get_feed,
    list_feeds,
    list_holds,
)
from service.http.routes.ledger import get_account
from service.http.routes.observations import post_observation
from service.http.routes.operations import get_operation, get_operation_by_key
from service.logs import configure_logging
from service.serving import die_with_server
from service.telemetry import Metrics, RequestTelemetry, configure_tracing, flush_tracing

__all__ = ["app_from_env", "create_app"]

log = logging.getLogger("settlement.app")


def create_app(settings: Settings) -> Litestar:
    """The application."""
    require_endpoints(settings)
    counted = Metrics(settings.metrics_dir, export=settings.otel_exporter)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # kept in the app's state: for the handlers' dependency and for what gets no
        # dependencies (guards, before_request hooks: service.http.deps.settlement_of)
        settlement = app.state.settlement = await Settlement.open(settings, metrics=counted)
        log.info("server ready")
        try:
            yield
        finally:
            await settlement.close()
            flush_tracing()

    def opened() -> Settlement:
        """The Settlement the lifespan opened (handlers get it as ``settlement``)."""
        found: Settlement = app.state.settlement
        return found

    app = Litestar(
        route_handlers=[
            health,
            livez,
            readyz,
            metrics,
            problem_page,
            *idempotent_handlers(),
            get_account,
            get_operation,
            get_operation_by_key,
            create_principal,
            rotate_principal,
            revoke_principal,
            supersede_operation,
            resolve_operation,
            list_work,
            post_observation,
            list_feeds,
            get_feed,
            list_holds,
            decide_hold,
            accept_conflict,
            console_router(),
        ],
        template_config=template_config(),
        dependencies={"settlement": Provide(opened, sync_to_thread=False)},
        lifespan=[lifespan],
        exception_handlers=exception_handlers,
        request_max_body_size=settings.body_limit,
        openapi_config=openapi_config(reference=settings.api_reference),
        logging_config=None,  # service.logs owns logging
        debug=False,
    )
    # a deadline for the request body, whose reads raise inside Litestar's exception handlers
    app.asgi_handler = BodyDeadline(app.asgi_handler, settings.body_timeout)
    # the console's security headers on every answer under /console, its 404s included
    app.asgi_handler = ConsoleHeaders(app.asgi_handler)
    # outside the exception handlers, so every answer (404s too) has its Request-Id and counts
    app.asgi_handler = RequestTelemetry(app.asgi_handler, counted, access_log=settings.access_log)
    # outermost: the scheme and client address a trusted proxy forwarded, for every layer
    app.asgi_handler = Forwarded(app.asgi_handler, settings.forwarded_allow_ips)
    return app


class Forwarded:
    """uvicorn's public ProxyHeadersMiddleware (scheme and client from X-Forwarded-Proto and
    X-Forwarded-For, when the peer is one of ``trusted``), typed as Litestar's handlers are."""

    def __init__(self, app: Any, trusted: str) -> None:
        self._inner = ProxyHeadersMiddleware(app, trusted_hosts=trusted)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._inner(scope, receive, send)


def app_from_env() -> Litestar:
    """Factory for ASGI servers: settings read once, here, from the environment."""
    die_with_server()
    settings = Settings.from_env()
    configure_logging(settings)
    configure_tracing(settings.otel_exporter)
    return create_app(settings)
