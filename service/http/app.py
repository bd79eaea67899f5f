"""The Litestar application factory and the per-process runtime it carries."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import ConfigError, Settings
from service.domain.payouts import ProviderClient
from service.failpoints import Failpoints
from service.http.health import health, metrics
from service.http.idempotency import Idempotency
from service.http.late import LateAnswers
from service.http.problems import exception_handlers
from service.http.routes.admin import (
    create_principal,
    list_work,
    rotate_principal,
    supersede_operation,
)
from service.http.routes.ledger import (
    ACCOUNTS,
    TRANSFERS,
    get_account,
    post_account,
    post_transfer,
)
from service.http.routes.observations import post_observation
from service.http.routes.operations import get_operation, get_operation_by_key
from service.http.routes.payouts import payouts_route, post_payout
from service.leases import LeaseManager, make_redis
from service.logs import configure_logging
from service.store.db import make_engine, reader
from service.store.migrate import ensure_current
from service.store.notify import TerminalWaiter
from service.store.principals import PrincipalStore
from service.store.settlement import SettlementStore
from service.sweeper import Sweeper
from service.telemetry import Metrics

__all__ = ["Runtime", "app_from_env", "create_app"]

log = logging.getLogger("settlement.app")


class Runtime:
    """What one server process holds: settings, the engine, Redis, stores, leases."""

    def __init__(
        self, settings: Settings, engine: AsyncEngine, redis: Redis, database_url: str
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.reader = reader(engine)  # single-statement reads without BEGIN/ROLLBACK
        self.redis = redis
        self.metrics = Metrics()
        self.store = SettlementStore(
            engine,
            hooks=self.metrics,
            policy=settings.terminal_policy,
            retention=settings.retention,
            max_retries=settings.settle_max_retries,
        )
        self.principals = PrincipalStore(engine)
        self.leases = LeaseManager(redis, ttl=settings.lease_ttl)
        self.waiter = TerminalWaiter(database_url, connect_timeout=settings.db_connect_timeout)
        self.failpoints = Failpoints.from_settings(settings)
        self.idempotency = Idempotency(self)
        self.provider: ProviderClient | None = None
        if settings.provider_url and settings.provider_secret:
            # the client's own bound is the late window; each attempt waits provider_timeout
            self.provider = ProviderClient(
                settings.provider_url,
                settings.provider_secret,
                timeout=settings.provider_timeout + settings.late_response_window,
            )
        self.payouts = payouts_route(self)
        self.routes = {spec.route: spec for spec in (ACCOUNTS, TRANSFERS, self.payouts)}
        self.external_routes = frozenset(r for r, s in self.routes.items() if s.external)
        self.late = LateAnswers(self.store, self.metrics)
        self.sweeper = Sweeper(
            self.store, self.leases, self.metrics, interval=settings.sweep_interval
        )

    async def close(self) -> None:
        await self.late.close()
        await self.waiter.close()
        if self.provider is not None:
            await self.provider.close()


def create_app(settings: Settings) -> Litestar:
    if settings.database_url is None or settings.redis_url is None:
        raise ConfigError(
            "SETTLEMENT_DATABASE_URL and SETTLEMENT_REDIS_URL must be set "
            "(or start with `settlement serve --embedded`)"
        )
    database_url, redis_url = settings.database_url, settings.redis_url

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        engine = make_engine(settings, database_url)
        redis = make_redis(settings, redis_url)
        try:
            await ensure_current(engine)
            runtime = Runtime(settings, engine, redis, database_url)
            if settings.bootstrap_admin_key:
                await runtime.principals.ensure_bootstrap_admin(settings.bootstrap_admin_key)
            app.state.runtime = runtime
            sweeping = asyncio.create_task(runtime.sweeper.run(), name="lease-sweeper")
            log.info("server ready")
            try:
                yield
            finally:
                sweeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeping
                await runtime.close()
        finally:
            await redis.aclose()
            await engine.dispose()

    return Litestar(
        route_handlers=[
            health,
            metrics,
            post_account,
            get_account,
            post_transfer,
            get_operation,
            get_operation_by_key,
            create_principal,
            rotate_principal,
            supersede_operation,
            list_work,
            post_payout,
            post_observation,
        ],
        lifespan=[lifespan],
        exception_handlers=exception_handlers,
        request_max_body_size=settings.body_limit,
        openapi_config=OpenAPIConfig(
            title="Settlement server",
            version="1.0.0",
            path="/schema",
        ),
        logging_config=None,  # service.logs owns logging
        debug=False,
    )


def app_from_env() -> Litestar:
    """Factory for ASGI servers: settings read once, here, from the environment."""
    settings = Settings.from_env()
    configure_logging(settings)
    return create_app(settings)
