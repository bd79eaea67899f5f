"""The hot path's connections: asyncpg connections borrowed from SQLAlchemy's pool, whose
statements are sent on asyncpg itself, without SQLAlchemy in between.

SQLAlchemy builds, compiles and adapts every statement it sends: in
``python -m bench.statement_cost`` one indexed read costs 0.39-0.55 ms of client CPU through
SQLAlchemy Core against 0.03-0.19 ms prepared on asyncpg, in the same run 3 to 12 times less
(the machine is shared; the spread is between runs). The statements every request sends
(:mod:`service.store.hot`) and the local effects go through :class:`HotPool`; SQLAlchemy keeps
the schema, the migrations and every cold path.

There is one pool per worker, the engine's (:func:`service.store.db.make_engine`): one size
(``db_pool_size``), one acquire timeout (``db_connect_timeout``) and one set of session
settings (:func:`service.store.db.server_settings`) for every connection, hot or cold. A
borrow takes the pooled DBAPI connection (``AsyncEngine.raw_connection()``) and hands out
the asyncpg connection under it (``.driver_connection``): asyncpg's statement cache lives on
that connection, so a hot statement is prepared once per connection, as before. (Measured in
process, CPU per checkout and ``SELECT 1``: asyncpg's own pool 76-96 us, ``raw_connection()``
99-104 us, ``engine.connect()`` with ``get_raw_connection()`` 151-168 us.)
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.store.db import DATABASE_GONE, DatabaseUnavailable, make_engine, unavailable

__all__ = ["HotPool", "make_pool", "plain_dsn"]


def plain_dsn(url: str) -> str:
    """A libpq-style URL for asyncpg, whatever driver name the setting carries."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


class HotPool:
    """``async with pool.acquire() as conn``: an asyncpg connection of ``engine``'s pool.

    A request never waits for a connection longer than ``db_connect_timeout``: the engine's
    ``pool_timeout`` (then :class:`service.store.db.PoolTimeout`, a
    :class:`~service.store.db.DatabaseUnavailable`: 503); a free connection
    is taken without waiting (SQLAlchemy's queue only times a wait that happens)."""

    __slots__ = ("engine",)

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def acquire(self) -> _Borrow:
        return _Borrow(self.engine)

    async def close(self) -> None:
        """Close the engine's pool (the engine is this pool's, or shared with the store)."""
        await self.engine.dispose()


class _Borrow:
    """One ``async with`` of :meth:`HotPool.acquire`.

    Its end gives the connection back to SQLAlchemy's pool (``.close()`` on the pooled
    connection). The pool's own reset on return (``pool_reset_on_return="rollback"``) rolls
    back only a transaction SQLAlchemy began; one begun on the asyncpg connection itself is
    not seen by it. The hot path's transactions are asyncpg's ``conn.transaction()``, which
    rolls back on any exception; a connection that still is in a transaction at the end, or
    whose statement was interrupted (a cancellation, asyncpg's own timeout: a cancel request
    may still be in flight) or whose link broke, is not given to the next user: it is
    invalidated (closed at once, without waiting; the pool opens a new one when needed).
    Nothing else on the hot path changes session state, so nothing else is reset (asyncpg's
    default ``RESET ALL``, ``UNLISTEN *``, ... would be one more round trip per request)."""

    __slots__ = ("_engine", "_raw")

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._raw: Any = None

    async def __aenter__(self) -> Any:
        self._raw = await self._engine.raw_connection()
        return self._raw.driver_connection

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        raw, self._raw = self._raw, None
        conn = raw.driver_connection
        clean = exc is None or (isinstance(exc, Exception) and not isinstance(exc, _INTERRUPTED))
        if clean and not conn.is_in_transaction() and not conn.is_closed():
            raw.close()  # back to SQLAlchemy's pool
        else:
            raw.invalidate(exc if isinstance(exc, Exception) else None)
        gone = unavailable(exc) if isinstance(exc, Exception) else None
        if gone is not None and gone is not exc:  # the driver's error leaves as the store's
            raise gone from exc


# what may leave a statement in flight or a connection unusable (a BaseException that is
# not an Exception, a cancellation, is treated the same)
_INTERRUPTED: tuple[type[BaseException], ...] = (TimeoutError, DatabaseUnavailable, *DATABASE_GONE)


async def make_pool(settings: Settings, url: str, *, size: int | None = None) -> HotPool:
    """A pool of its own (an engine of ``size`` connections, default ``db_pool_size``), for
    a caller without the server's engine (tests, benchmarks); ``close()`` disposes it."""
    return HotPool(make_engine(settings, url, pool_size=size))
