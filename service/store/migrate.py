"""Run Alembic from code: the migrations folder sits beside the package, no alembic.ini needed."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.db import async_url

__all__ = [
    "SchemaNotCurrent",
    "alembic_config",
    "current_revision",
    "downgrade",
    "ensure_current",
    "head_revision",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


class SchemaNotCurrent(RuntimeError):
    """The database is not migrated to the code's head revision."""


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", async_url(url).replace("%", "%%"))
    return config


def head_revision() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None, "no migrations found"
    return head


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database at ``url`` (blocking; call from a thread inside an event loop)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


async def current_revision(engine: AsyncEngine) -> str | None:
    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def ensure_current(engine: AsyncEngine) -> None:
    """Refuse to serve on a database that is not at the code's head revision."""
    found = await current_revision(engine)
    expected = head_revision()
    if found != expected:
        shown = found or "an empty (un-migrated) database"
        raise SchemaNotCurrent(
            f"database schema is at {shown}, this server needs {expected}: "
            "run `settlement migrate` first"
        )
