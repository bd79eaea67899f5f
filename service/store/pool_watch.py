"""How many of the worker's database connections are lent out, told as it changes: a
request, a local effect and a cold read each borrow one of the engine's pool
(:mod:`service.store.pool`), and one waiting for a connection of a pool all lent out waits up
to ``db_connect_timeout`` and then answers 503, so a pool all lent out is what to alert on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

__all__ = ["watch_pool"]


def watch_pool(engine: AsyncEngine, report: Callable[[int, int], None]) -> None:
    """Call ``report(lent, size)`` now and on every checkout and return of a connection of
    ``engine``'s pool (SQLAlchemy's pool events, in the worker's own thread: no lock)."""
    pool = engine.sync_engine.pool
    size = pool.size() if isinstance(pool, QueuePool) else 0  # the engine's is a QueuePool
    lent = 0

    def checkout(*_: Any) -> None:
        nonlocal lent
        lent += 1
        report(lent, size)

    def checkin(*_: Any) -> None:  # an invalidated connection's return too
        nonlocal lent
        lent = max(0, lent - 1)
        report(lent, size)

    event.listen(pool, "checkout", checkout)
    event.listen(pool, "checkin", checkin)
    report(lent, size)
