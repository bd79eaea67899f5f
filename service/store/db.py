"""The async engine: every connection carries connect, statement and lock timeouts."""

from __future__ import annotations

import asyncpg
import sqlalchemy.exc
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.config import Settings

__all__ = [
    "DATABASE_GONE",
    "PoolTimeout",
    "async_url",
    "database_gone",
    "make_engine",
    "ping",
    "reader",
    "server_settings",
]

# PoolTimeout: no connection of SQLAlchemy's pool came free within its timeout.

# The database went away under a statement or would not take a connection (a restart, a
# dropped connection, "the database system is starting up"): the transaction is gone, and
# whether a COMMIT in flight landed is not known, so the answer is "retry with the same key".
DATABASE_GONE: tuple[type[BaseException], ...] = (
    ConnectionError,  # a reset socket; asyncpg's "unexpected connection_lost() call"
    asyncpg.exceptions.PostgresConnectionError,  # 08xxx, and a connection closed mid-query
    asyncpg.exceptions.OperatorInterventionError,  # shutting down, starting up (57P0x)
    asyncpg.exceptions.InterfaceError,  # "the underlying connection is closed"
    sqlalchemy.exc.OperationalError,  # the same, wrapped by SQLAlchemy
    sqlalchemy.exc.InterfaceError,
)


def database_gone(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it wraps, says the database went away. SQLAlchemy wraps
    some of asyncpg's (a connection closed mid-operation) in a bare ``DBAPIError``."""
    for _ in range(8):  # a chain is a few links long; never loop on a cycle
        if exc is None:
            return False
        if isinstance(exc, DATABASE_GONE):
            return True
        if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def async_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs and use the asyncpg driver."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername in ("postgresql", "postgresql+psycopg", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def make_engine(settings: Settings, url: str, *, pool_size: int | None = None) -> AsyncEngine:
    return create_async_engine(
        async_url(url),
        pool_size=pool_size or settings.db_pool_size,
        max_overflow=0,
        pool_timeout=settings.db_connect_timeout,
        pool_pre_ping=False,
        hide_parameters=True,  # bound values (key hashes, bodies) stay out of error logs
        connect_args={
            "timeout": settings.db_connect_timeout,
            "command_timeout": settings.db_statement_timeout + 1,
            "server_settings": server_settings(settings),
        },
    )


def server_settings(settings: Settings) -> dict[str, str]:
    """Every connection's timeouts, set by PostgreSQL itself (both pools)."""
    return {
        "application_name": "settlement",
        "statement_timeout": _ms(settings.db_statement_timeout),
        "lock_timeout": _ms(settings.db_lock_timeout),
        "idle_in_transaction_session_timeout": _ms(settings.db_statement_timeout * 2),
    }


def _ms(seconds: float) -> str:
    """PostgreSQL takes its timeouts in milliseconds."""
    return str(int(seconds * 1000))


async def ping(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


def reader(engine: AsyncEngine) -> AsyncEngine:
    """The same pool for single-statement reads: AUTOCOMMIT, so no BEGIN/ROLLBACK round trips
    around one SELECT (each statement is its own snapshot; nothing is locked)."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")
