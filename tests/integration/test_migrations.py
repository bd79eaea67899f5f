"""Migrations against real PostgreSQL: reversible, and matching the table metadata exactly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.app.routes import SCHEMA as metadata
from service.store.db import async_url
from service.store.migrate import (
    SchemaNotCurrent,
    current_revision,
    downgrade,
    ensure_current,
    head_revision,
    upgrade,
)
from tests.conftest import Services, create_database

pytestmark = pytest.mark.integration


def _diff(connection: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(connection), metadata))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names()) - {"alembic_version"}


@pytest.fixture
async def empty_database(services: Services) -> AsyncIterator[tuple[str, AsyncEngine]]:
    """A database of this test's own, not migrated, and an engine on it."""
    url = await create_database(services, "migrations")
    engine = create_async_engine(async_url(url))
    yield url, engine
    await engine.dispose()


async def _inspect(engine: AsyncEngine) -> tuple[str | None, set[str], list[object]]:
    async with engine.connect() as conn:
        tables = await conn.run_sync(_tables)
        diff = await conn.run_sync(_diff)
    return await current_revision(engine), tables, diff


# Alembic runs its async migrations on a loop of its own: from a test, call it in a thread.


async def test_upgrade_downgrade_upgrade_is_clean_and_matches_metadata(
    empty_database: tuple[str, AsyncEngine],
) -> None:
    url, engine = empty_database

    await asyncio.to_thread(upgrade, url)
    revision, tables, diff = await _inspect(engine)
    assert revision == head_revision()
    assert tables == set(metadata.tables)
    assert diff == []

    await asyncio.to_thread(downgrade, url, "base")
    revision, tables, _ = await _inspect(engine)
    assert revision is None
    assert tables == set()

    await asyncio.to_thread(upgrade, url)
    revision, tables, diff = await _inspect(engine)
    assert revision == head_revision()
    assert tables == set(metadata.tables)
    assert diff == [], f"ORM metadata drifted from the migrations: {diff}"


async def test_server_refuses_an_unmigrated_database(
    empty_database: tuple[str, AsyncEngine],
) -> None:
    url, engine = empty_database
    with pytest.raises(SchemaNotCurrent, match="settlement migrate"):
        await ensure_current(engine)
    await asyncio.to_thread(upgrade, url)
    await ensure_current(engine)
