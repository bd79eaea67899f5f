"""Wake ``Prefer: wait`` requests when an operation settles: PostgreSQL LISTEN/NOTIFY.

The settlement transaction sends ``pg_notify`` with the operation id; PostgreSQL delivers it
only if that transaction commits. One listening connection per process fans it out to the
waiters registered for that id. If the connection is lost, waits simply run to their
timeout (the caller re-reads the row either way), and the next wait reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from service.store.unit_of_work import TERMINAL_CHANNEL

__all__ = ["TerminalWaiter"]

log = logging.getLogger("settlement.notify")


class TerminalWaiter:
    def __init__(self, database_url: str, *, connect_timeout: float) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)
        self._connect_timeout = connect_timeout
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    async def _ensure_listening(self) -> None:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return
            try:
                conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
                await conn.add_listener(TERMINAL_CHANNEL, self._on_notify)
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("cannot listen for settlements", extra={"error": repr(exc)})
                return
            self._conn = conn

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        for future in self._waiters.pop(payload, set()):
            if not future.done():
                future.set_result(None)

    @contextlib.asynccontextmanager
    async def wait_for(self, operation_id: str) -> AsyncIterator[asyncio.Future[None]]:
        """Register first, then re-read the row, then await: no settlement slips between."""
        await self._ensure_listening()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(operation_id, set()).add(future)
        try:
            yield future
        finally:
            waiting = self._waiters.get(operation_id)
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._waiters[operation_id]
            future.cancel()

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=self._connect_timeout)
            self._conn = None
