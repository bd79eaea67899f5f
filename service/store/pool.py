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
    for a connection longer than ``db_connect_timeout`` (then TimeoutError: 503)."""

    def __init__(self, pool: Any, acquire_timeout: float) -> None:
        self._pool = pool
        self._timeout = acquire_timeout

    def acquire(self) -> Any:
        """``async with pool.acquire() as conn:``"""
        return self._pool.acquire(timeout=self._timeout)

    async def close(self) -> None:
        await self._pool.close()


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
        },
        init=_init,
        reset=_keep_session,
    )
    return HotPool(pool, settings.db_connect_timeout)


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
