"""Shared fixtures of the integration tests: real PostgreSQL (the session's migrated
database) and real Redis, each client made and closed on the test's own event loop."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.config import Settings
from service.leases import LeaseManager, LeaseRedis, make_lease_redis, make_redis
from service.leases.lease import DEFAULT_PREFIX
from service.store.db import async_url
from service.store.feeds import FeedStore
from service.store.pool import make_pool
from service.store.settlement import SettlementStore
from tests.conftest import Services
from tests.integration.asgi import Asgi
from tests.integration.factories import Clock, Scope, make_principal, make_scope

# Socket timeout of the test Redis clients: small, so unreachable-Redis cases finish quickly.
REDIS_TIMEOUT = 0.5
# Lease of the shared LeaseManager: longer than any test, so a held lease never lapses
# mid-test; tests about expiry make a manager with a short ttl of their own.
LEASE_MANAGER_TTL = 30.0
# Connections of one test engine: enough for the concurrent claims and settlers of one test.
POOL_SIZE = 5


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def open_engine(migrated_url: str) -> AsyncIterator[Callable[[], AsyncEngine]]:
    """Makes engines (each its own connection pool) on the migrated database; all are
    disposed when the test ends."""
    engines: list[AsyncEngine] = []

    def open_() -> AsyncEngine:
        engines.append(
            create_async_engine(async_url(migrated_url), pool_size=POOL_SIZE, max_overflow=0)
        )
        return engines[-1]

    yield open_
    for engine in engines:
        await engine.dispose()


@pytest.fixture
def engine(open_engine: Callable[[], AsyncEngine]) -> AsyncEngine:
    return open_engine()


@pytest.fixture
async def pool(migrated_url: str) -> AsyncIterator[Any]:
    """The hot path's HotPool (an engine of its own, as the server's settings make it) on the
    migrated database, closed when the test ends."""
    made = await make_pool(Settings.from_env({}), migrated_url, size=POOL_SIZE)
    yield made
    await made.close()


@pytest.fixture
def store(engine: AsyncEngine, clock: Clock, pool: Any) -> SettlementStore:
    return SettlementStore(engine, clock=clock, pool=pool)


@pytest.fixture
async def principal_id(engine: AsyncEngine) -> uuid.UUID:
    """A client principal of its own, so no other test's operations share its scopes."""
    return await make_principal(engine)


@pytest.fixture
def scope(principal_id: uuid.UUID) -> Scope:
    """A fresh scope (route and Idempotency-Key) of ``principal_id``."""
    return make_scope(principal_id)


@pytest.fixture
async def connect_redis() -> AsyncIterator[Callable[[str], Redis]]:
    """Makes Redis clients for a URL (the suite's, a relay's, a dead port's); all are closed
    when the test ends."""
    clients: list[Redis] = []

    def connect(url: str) -> Redis:
        settings = Settings.from_env({}, redis_url=url, redis_timeout=REDIS_TIMEOUT)
        clients.append(make_redis(settings, url))
        return clients[-1]

    yield connect
    for client in clients:
        await client.aclose()


@pytest.fixture
def redis(services: Services, connect_redis: Callable[[str], Redis]) -> Redis:
    return connect_redis(services.redis_url)


@pytest.fixture
async def connect_leases() -> AsyncIterator[Callable[..., LeaseManager]]:
    """Makes lease managers as the server does (on a lease client of their own, each command
    bounded by REDIS_TIMEOUT) for a URL: ``connect(url, ttl=..., prefix=...)``; their
    clients are closed when the test ends."""
    clients: list[LeaseRedis] = []

    def connect(
        url: str, *, ttl: float = LEASE_MANAGER_TTL, prefix: str = DEFAULT_PREFIX
    ) -> LeaseManager:
        settings = Settings.from_env({}, redis_url=url, redis_timeout=REDIS_TIMEOUT)
        clients.append(make_lease_redis(settings, url))
        return LeaseManager(clients[-1], ttl=ttl, timeout=REDIS_TIMEOUT, prefix=prefix)

    yield connect
    for client in clients:
        await client.aclose()


@pytest.fixture
def leases(services: Services, connect_leases: Callable[..., LeaseManager]) -> LeaseManager:
    """Leases under a prefix of this test's own, so no other test's leases are seen."""
    return connect_leases(services.redis_url, prefix=f"test:{uuid.uuid4().hex}:")


@pytest.fixture
def feed_store(engine: AsyncEngine, store: SettlementStore) -> FeedStore:
    """The feed observer's store, on the test's engine and settlement store."""
    return FeedStore(engine, store.runner, settle=store.settle_phase_of)


@pytest.fixture
def feed_name() -> str:
    """A feed of the test's own."""
    return "f" + uuid.uuid4().hex[:12]


@pytest.fixture
async def app(services: Services, migrated_url: str) -> AsyncIterator[Asgi]:
    """The whole application over ASGI in this process (its lifespan started), on the
    migrated database and the test Redis: what a server process runs, without the server."""
    from service.http.app import create_app

    settings = Settings.from_env(
        {}, database_url=migrated_url, redis_url=services.redis_url, sweep_interval=3600.0
    )
    driven = Asgi(create_app(settings))
    await driven.start()
    yield driven
    await driven.stop()
