"""Real PostgreSQL and Redis for the suite: embedded and throw-away, or the ones named by
``SETTLEMENT_DATABASE_URL`` / ``SETTLEMENT_REDIS_URL`` when those are set."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive one coroutine to completion on a fresh event loop, from synchronous code (session
    fixtures, end-to-end helpers); async tests simply await."""
    return asyncio.run(coro)


class Services:
    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database_url = database_url
        self.redis_url = redis_url


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A fresh directory per test, outside pytest's own base directory: the embedded
    PostgreSQL runs as another user when we are root and must pass through the directory's
    parents, and each pytest session on the machine resets ``/tmp/pytest-of-<user>`` to
    0700, which would cut off a cluster of a session running beside it."""
    path = Path(tempfile.mkdtemp(prefix="settlement-tmp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    database_url = os.environ.get("SETTLEMENT_DATABASE_URL") or None
    redis_url = os.environ.get("SETTLEMENT_REDIS_URL") or None
    if database_url and redis_url:
        yield Services(database_url, redis_url)
        return
    from devstack import EmbeddedServices

    data_dir = Path(tempfile.mkdtemp(prefix="settlement-test-"))
    try:
        with EmbeddedServices(
            data_dir,
            want_postgres=database_url is None,
            want_redis=redis_url is None,
            durable=False,
        ) as embedded:
            yield Services(database_url or embedded.database_url, redis_url or embedded.redis_url)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def _admin_execute(url: str, *statements: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from service.store.db import async_url

    engine = create_async_engine(async_url(url), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def create_database(services: Services, prefix: str) -> str:
    """Create an empty database on the test server and return its URL (inside a test's loop)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    await _admin_execute(services.database_url, f'CREATE DATABASE "{name}"')
    return _with_database(services.database_url, name)


def fresh_database(services: Services, prefix: str) -> str:
    """``create_database`` for synchronous fixtures and tests."""
    return run(create_database(services, prefix))


@pytest.fixture(scope="session")
def migrated_url(services: Services) -> str:
    """One database migrated to head, shared by the session (tests use their own rows)."""
    from service.store.migrate import upgrade

    url = fresh_database(services, "suite")
    upgrade(url)
    return url
