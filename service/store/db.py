"""The async engine, the worker's one connection pool: every connection carries the same
connect, statement and lock timeouts and session settings, whether the hot path
(:mod:`service.store.pool`) or a cold path (SQLAlchemy) uses it.

"Is the database gone" is decided here, once (:func:`database_gone`), and the engine answers
it for every user of the pool: a connection that cannot be had (none came free in time, or
the server refused to open one) and a statement the database went away under leave the store
as :class:`DatabaseUnavailable`, never as the driver's errors (asyncpg's, SQLAlchemy's). The
hot path's statements, sent on asyncpg itself, are translated the same way where their
connection is given back (:class:`service.store.pool.HotPool`)."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
import sqlalchemy.exc
from sqlalchemy import event, text
from sqlalchemy.engine import ExceptionContext, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool, PoolProxiedConnection

from service.config import Settings
from service.errors import SettlementError

__all__ = [
    "DATABASE_GONE",
    "DatabaseUnavailable",
    "PoolTimeout",
    "async_url",
    "database_gone",
    "json_text",
    "make_engine",
    "ping",
    "reader",
    "role_settings_sql",
    "server_settings",
    "unavailable",
]


class DatabaseUnavailable(SettlementError):
    """The database went away under a statement or would not give a connection: nothing of
    the transaction is known to have committed, so the answer is "retry with the same key"."""

    problem = "service-unavailable"


class PoolTimeout(DatabaseUnavailable):
    """No connection of the pool came free within ``db_connect_timeout``."""


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


def unavailable(exc: BaseException) -> DatabaseUnavailable | None:
    """What the store raises instead of ``exc``: a :class:`DatabaseUnavailable` when the
    database is gone (or ``exc`` already is one), else None (``exc`` goes on as it is)."""
    if isinstance(exc, DatabaseUnavailable):
        return exc
    if isinstance(exc, sqlalchemy.exc.TimeoutError):  # the pool's queue: nothing came free
        return PoolTimeout(f"no database connection came free in time ({exc})")
    if database_gone(exc):
        return DatabaseUnavailable(f"the database is unreachable ({type(exc).__name__})")
    return None


class _Pool(AsyncAdaptedQueuePool):
    """The engine's pool, whose checkout raises :class:`DatabaseUnavailable` when no
    connection can be had (the pool's own timeout, a server that refuses connections)."""

    def connect(self) -> PoolProxiedConnection:
        try:
            return super().connect()
        except Exception as exc:
            gone = unavailable(exc)
            if gone is None:
                raise
            raise gone from exc


def _statement_failed(context: ExceptionContext) -> None:
    """The engine's ``handle_error`` hook: a statement the database went away under raises
    :class:`DatabaseUnavailable` (SQLAlchemy has invalidated the connection by then). A
    cancellation (an exit exception, which SQLAlchemy counts as a disconnect) goes on as it
    is: turned into an error, it would no longer cancel its task."""
    if not isinstance(context.original_exception, Exception):
        return
    if context.is_disconnect:
        raise DatabaseUnavailable("the database connection was lost") from (
            context.original_exception
        )
    gone = unavailable(context.original_exception)
    if gone is not None:
        raise gone from context.original_exception


def async_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs and use the asyncpg driver."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername in ("postgresql", "postgresql+psycopg", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def json_text(value: Any) -> str:
    """A JSON value as the text PostgreSQL takes for json/jsonb: the engine's serializer for
    SQLAlchemy's JSON types, and what the hot path sends for a JSON parameter (asyncpg's
    json/jsonb codecs on the engine's connections are SQLAlchemy's: text in, and out the
    value decoded by :func:`msgspec.json.decode`)."""
    return msgspec.json.encode(value).decode()


def make_engine(
    settings: Settings, url: str, *, pool_size: int | None = None, name: str = "settlement"
) -> AsyncEngine:
    """The pool of ``pool_size`` (default ``db_pool_size``) connections, never more: a
    request, a local effect, a status view and a cold path alike wait at most
    ``db_connect_timeout`` for one (then :class:`PoolTimeout`). ``name``: the connections'
    ``application_name`` (what ``pg_stat_activity`` shows). Its errors of a database gone
    are :class:`DatabaseUnavailable` (see the module's docstring).

    A connection given back is rolled back by the pool if SQLAlchemy began a transaction on
    it (``pool_reset_on_return``'s default; no round trip when none is open: 0-4 us of CPU
    per checkout measured against none); the hot path's own transactions are asyncpg's,
    which :class:`service.store.pool.HotPool` checks itself."""
    engine = create_async_engine(
        async_url(url),
        poolclass=_Pool,
        pool_size=pool_size or settings.db_pool_size,
        max_overflow=0,
        pool_timeout=settings.db_connect_timeout,
        pool_pre_ping=False,
        pool_reset_on_return="rollback",
        hide_parameters=True,  # bound values (key hashes, bodies) stay out of error logs
        json_serializer=json_text,
        json_deserializer=msgspec.json.decode,
        connect_args={
            "timeout": settings.db_connect_timeout,
            "command_timeout": settings.db_statement_timeout + 1,
            "server_settings": {**server_settings(settings), "application_name": name},
        },
    )
    event.listen(engine.sync_engine, "handle_error", _statement_failed)
    return engine


def server_settings(settings: Settings) -> dict[str, str]:
    """Every connection's timeouts and session settings, set by PostgreSQL itself when the
    connection opens (no round trip of their own)."""
    return {
        "application_name": "settlement",
        "statement_timeout": _ms(settings.db_statement_timeout),
        # one lock timeout for every path: a row held longer answers 503/409, never a queue
        "lock_timeout": _ms(settings.db_lock_timeout),
        "idle_in_transaction_session_timeout": _ms(settings.db_statement_timeout * 2),
        # Every hot statement finds its rows by a unique key, so one generic plan per
        # connection fits all: without this, PostgreSQL plans each statement anew for its
        # first five executions on every connection (a new transfer's statement is large:
        # make bench measured 1.23-1.53 -> 0.95-0.99 ms of PostgreSQL CPU per new one). A
        # generic plan cannot prove a partial index's predicate from a parameter, so a cold
        # statement filtering on a state a partial index names writes that state inline
        # (service.store.tables.inline).
        "plan_cache_mode": settings.db_plan_cache_mode,
        # timestamps PostgreSQL writes into JSON (the status views' lists) end in +00:00,
        # as asyncpg's own timestamps are in UTC
        "timezone": "UTC",
    }


def role_settings_sql(settings: Settings, role: str) -> list[str]:
    """:func:`server_settings` as ``ALTER ROLE`` statements for ``role``. What a connection
    sends when it opens reaches that server only: on Citus, the connections the coordinator
    opens to the workers run with the role's settings, which Citus propagates to every node."""
    quoted_role = '"' + role.replace('"', '""') + '"'
    return [
        f"ALTER ROLE {quoted_role} SET {name} = '{value.replace(chr(39), chr(39) * 2)}';"
        for name, value in server_settings(settings).items()
        if name != "application_name"  # each connection names itself
    ]


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
