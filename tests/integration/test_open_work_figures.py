"""The operations' figures of /metrics read from real PostgreSQL: open operations by state,
counted up to a cap, the purge's first expiry; and the pool gauges told by the pool's own
checkouts and returns."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.config import Settings
from service.store.db import async_url, make_engine
from service.store.open_work import read_open_work
from service.store.pool import HotPool
from service.store.pool_watch import watch_pool
from tests.conftest import Services, fresh_database
from tests.integration.factories import make_principal

# An operation row in ``state``: the columns its checks ask for, a result when it has one.
_OPERATION = text(
    """
INSERT INTO operations (id, tenant, principal_id, bound_principal_id,
    bound_credential_generation, fencing_token, idempotency_key, route, request_fingerprint,
    state, binding_generation, revision, created_at, updated_at, expires_at, conflict,
    result_status, result_content_type, result_body, result_digest)
SELECT gen_random_uuid(), 'acme', :principal, :principal, 1, 1, :state || n || :tag,
    'POST /v1/transfers', repeat('a', 64), :state, 1, 1, now(), now(), :expires,
    CASE WHEN :state = 'conflict' THEN '{}'::jsonb END,
    CASE WHEN :terminal THEN 201 END, CASE WHEN :terminal THEN 'application/json' END,
    CASE WHEN :terminal THEN '{}'::bytea END, CASE WHEN :terminal THEN repeat('b', 64) END
FROM generate_series(1, :count) AS n
"""
)


@pytest.fixture
def own_url(services: Services) -> str:
    """A database of this test's own: the counts are the whole table's."""
    from service.store.migrate import upgrade

    url = fresh_database(services, "openwork")
    upgrade(url)
    return url


@pytest.fixture
async def own_engine(own_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(async_url(own_url))
    yield engine
    await engine.dispose()


async def operations(
    engine: AsyncEngine, principal: uuid.UUID, state: str, count: int, expires: datetime | None
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            _OPERATION,
            {
                "principal": principal,
                "state": state,
                "count": count,
                "expires": expires,
                "terminal": state in ("completed", "failed", "conflict"),
                "tag": uuid.uuid4().hex[:6],
            },
        )


async def test_open_operations_are_counted_by_state_up_to_the_cap(
    own_engine: AsyncEngine,
) -> None:
    empty = await read_open_work(own_engine)
    assert empty.counts == {"in_progress": 0, "unknown": 0, "conflict": 0}
    assert empty.first_expiry is None
    principal = await make_principal(own_engine)
    expired = datetime.now(UTC) - timedelta(hours=1)
    await operations(own_engine, principal, "unknown", 5, None)
    await operations(own_engine, principal, "in_progress", 2, None)
    await operations(own_engine, principal, "conflict", 1, None)
    await operations(own_engine, principal, "completed", 3, expired)
    await operations(own_engine, principal, "failed", 1, expired - timedelta(minutes=5))
    read = await read_open_work(own_engine)
    assert read.counts == {"in_progress": 2, "unknown": 5, "conflict": 1}
    assert read.first_expiry is not None
    assert abs((read.first_expiry - (expired - timedelta(minutes=5))).total_seconds()) < 1
    capped = await read_open_work(own_engine, cap=3)
    assert capped.counts == {"in_progress": 2, "unknown": 3, "conflict": 1}  # 3: at least


async def test_the_pool_watch_tells_every_checkout_and_return(migrated_url: str) -> None:
    told: list[tuple[int, int]] = []
    engine = make_engine(Settings.from_env({}), migrated_url, pool_size=3)
    try:
        watch_pool(engine, lambda lent, size: told.append((lent, size)))
        assert told == [(0, 3)]
        pool = HotPool(engine)
        async with pool.acquire(), pool.acquire():
            assert told[-1] == (2, 3)
            assert engine.sync_engine.pool.checkedout() == 2  # type: ignore[attr-defined]
        assert told[-1] == (0, 3)
        with pytest.raises(ZeroDivisionError):  # a connection given back broken
            async with pool.acquire() as conn:
                await conn.execute("SELECT 1")
                raise ZeroDivisionError
        assert told[-1] == (0, 3)
        async with engine.connect() as conn:  # a cold path's connection is one of them
            await conn.execute(text("SELECT 1"))
            assert told[-1] == (1, 3)
        assert told[-1] == (0, 3)
    finally:
        await engine.dispose()
