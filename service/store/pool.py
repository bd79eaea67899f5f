"""The hot path's connection pool: asyncpg itself, without SQLAlchemy in between.

SQLAlchemy builds, compiles and adapts every statement it sends: in
``python -m bench.statement_cost`` one indexed read costs 0.39-0.55 ms of client CPU through
SQLAlchemy Core against 0.03-0.19 ms prepared on asyncpg, in the same run 3 to 12 times less
(the machine is shared; the spread is between runs). The statements every request sends
(:mod:`service.store.hot`) and the local effects go through this pool; SQLAlchemy keeps the
schema, the migrations and every cold path. Both pools carry the same server-side timeouts.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec
from sqlalchemy.engine import make_url

from service.config import Settings
from service.store.db import server_settings

__all__ = ["HotPool", "make_pool", "plain_dsn"]


def plain_dsn(url: str) -> str:
    """A libpq-style URL for asyncpg, whatever driver name the setting carries."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


class HotPool:
    """asyncpg's pool, with the one acquire timeout every caller gets: a request never waits
    for a connection longer than ``db_connect_timeout`` (then TimeoutError: 503).

    asyncpg runs an acquire with a timeout as a task of its own (``wait_for``): 20-25 us of
    CPU per request on this machine. While fewer than ``size`` connections are out, an idle
    or not yet opened one is there to take without waiting (opening one is bounded by the
    pool's connect timeout), so only an acquire that may queue gets the timeout."""

    def __init__(self, pool: Any, acquire_timeout: float, size: int) -> None:
        self._pool = pool
        self._timeout = acquire_timeout
        self._size = size
        self.out = 0  # connections handed out through acquire() and not yet back

    def acquire(self) -> _Borrow:
        """``async with pool.acquire() as conn:``"""
        return _Borrow(self)

    async def close(self) -> None:
        await self._pool.close()


class _Borrow:
    """One ``async with`` of :meth:`HotPool.acquire`: counted out from before the acquire
    until asyncpg has the connection back, and released within the acquire timeout whatever
    the acquire was given (asyncpg's release waits for a cancelled query or a rollback)."""

    __slots__ = ("_conn", "_hot")

    def __init__(self, hot: HotPool) -> None:
        self._hot = hot
        self._conn: Any = None

    async def __aenter__(self) -> Any:
        hot = self._hot
        timeout = None if hot.out < hot._size else hot._timeout
        hot.out += 1  # counted from here: a concurrent acquire must not count it free
        try:
            self._conn = await hot._pool.acquire(timeout=timeout)
        except BaseException:
            hot.out -= 1
            raise
        return self._conn

    async def __aexit__(self, *exc_info: object) -> None:
        hot = self._hot
        try:
            await hot._pool.release(self._conn, timeout=hot._timeout)
        finally:
            hot.out -= 1


async def make_pool(settings: Settings, url: str, *, size: int | None = None) -> HotPool:
    """An asyncpg pool of ``size`` (default ``db_pool_size``) connections."""
    pool = await asyncpg.create_pool(
        plain_dsn(url),
        min_size=1,
        max_size=size or settings.db_pool_size,
        timeout=settings.db_connect_timeout,
        command_timeout=settings.db_statement_timeout + 1,
        # the hot path's lock waits are short: a held account answers 503 within a second
        server_settings={
            **server_settings(settings),
            "lock_timeout": str(int(settings.db_hot_lock_timeout * 1000)),
            # Every hot statement finds its rows by a unique key, so one generic plan per
            # connection fits all: without this, PostgreSQL plans each statement anew for its
            # first five executions on every connection (a new transfer's statement is large:
            # make bench measured 1.23-1.53 -> 0.95-0.99 ms of PostgreSQL CPU per new one).
            "plan_cache_mode": "force_generic_plan",
            # timestamps PostgreSQL writes into JSON (the status views' lists) end in +00:00,
            # as asyncpg's own timestamps are in UTC
            "timezone": "UTC",
        },
        init=_init,
        reset=_keep_session,
    )
    return HotPool(pool, settings.db_connect_timeout, size or settings.db_pool_size)


async def _init(conn: Any) -> None:
    """jsonb as Python values (the ``conflict`` column), encoded and decoded by msgspec."""
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=lambda value: msgspec.json.encode(value).decode(),
        decoder=msgspec.json.decode,
    )


async def _keep_session(conn: Any) -> None:
    """What a released connection needs beyond asyncpg's own rollback of an open
    transaction: nothing. Nothing on the hot path changes session state, so the default
    reset (``RESET ALL``, ``UNLISTEN *``, ... : one more round trip per request) is skipped."""
