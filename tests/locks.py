"""Waiting on PostgreSQL's own account of who waits for a lock: the barrier of the tests that
hold a row while concurrent work queues behind it (observable state, never a sleep)."""

from __future__ import annotations

import asyncio
from typing import Any


async def lock_waiters(holder: Any, waiting: int, *, patience: float) -> None:
    """Wait until ``waiting`` sessions of ``holder``'s database, other than ``holder``
    itself, wait for a lock; fail after ``patience`` seconds. ``holder``: an asyncpg
    connection, typically inside the transaction that holds the row."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while True:
        # the activity view is read once per transaction unless its snapshot is cleared
        await holder.execute("SELECT pg_stat_clear_snapshot()")
        found = await holder.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        if found >= waiting:
            return
        assert loop.time() < deadline, f"{found} of {waiting} sessions queued for the lock"
        await asyncio.sleep(0.01)
