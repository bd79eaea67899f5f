"""Migrations against real PostgreSQL: reversible, and matching the table metadata exactly."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from service.store.db import async_url
from service.store.migrate import (
    SchemaNotCurrent,
    current_revision,
    downgrade,
    ensure_current,
    head_revision,
    upgrade,
)
from service.store.tables import metadata
from tests.conftest import Services, fresh_database, run

pytestmark = pytest.mark.integration


def _diff(connection: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(connection), metadata))


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names()) - {"alembic_version"}


async def _inspect(url: str) -> tuple[str | None, set[str], list[object]]:
    engine = create_async_engine(async_url(url))
    try:
        async with engine.connect() as conn:
            tables = await conn.run_sync(_tables)
            diff = await conn.run_sync(_diff)
        return await current_revision(engine), tables, diff
    finally:
        await engine.dispose()


def test_upgrade_downgrade_upgrade_is_clean_and_matches_metadata(services: Services) -> None:
    url = fresh_database(services, "migrations")

    upgrade(url)
    revision, tables, diff = run(_inspect(url))
    assert revision == head_revision()
    assert tables == set(metadata.tables)
    assert diff == []

    downgrade(url, "base")
    revision, tables, _ = run(_inspect(url))
    assert revision is None
    assert tables == set()

    upgrade(url)
    revision, tables, diff = run(_inspect(url))
    assert revision == head_revision()
    assert tables == set(metadata.tables)
    assert diff == [], f"ORM metadata drifted from the migrations: {diff}"


def test_server_refuses_an_unmigrated_database(services: Services) -> None:
    url = fresh_database(services, "unmigrated")

    async def check() -> None:
        engine = create_async_engine(async_url(url))
        try:
            await ensure_current(engine)
        finally:
            await engine.dispose()

    with pytest.raises(SchemaNotCurrent, match="settlement migrate"):
        run(check())
    upgrade(url)
    run(check())
