"""The Litestar application factory and the per-process runtime it carries."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.openapi import OpenAPIConfig
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import ConfigError, Settings
from service.http.health import health
from service.http.problems import exception_handlers
from service.leases import make_redis
from service.logs import configure_logging
from service.store.db import make_engine
from service.store.migrate import ensure_current
from service.store.settlement import SettlementStore

__all__ = ["Runtime", "app_from_env", "create_app"]

log = logging.getLogger("settlement.app")


class Runtime:
    """What one server process holds: settings, the engine, Redis, the settlement store."""

    def __init__(self, settings: Settings, engine: AsyncEngine, redis: Redis) -> None:
        self.settings = settings
        self.engine = engine
        self.redis = redis
        self.store = SettlementStore(
            engine,
            policy=settings.terminal_policy,
            retention=settings.retention,
            max_retries=settings.settle_max_retries,
        )


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
            app.state.runtime = Runtime(settings, engine, redis)
            log.info("server ready")
            yield
        finally:
            await redis.aclose()
            await engine.dispose()

    return Litestar(
        route_handlers=[health],
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
