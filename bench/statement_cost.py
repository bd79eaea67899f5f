"""CPU of one statement, through SQLAlchemy and straight on asyncpg: why the hot path is asyncpg.

Starts an embedded PostgreSQL (not durable) in a temporary directory, migrates it, then on
ONE connection sends the replay read (the scope's row, no match) N times each way, under the
default asyncio loop and under uvloop, and prints the client process's CPU per statement
(``time.process_time``; PostgreSQL's own CPU is not in it) and the wall time:

* SQLAlchemy Core with the expression built per call (as the store's cold paths do);
* SQLAlchemy with one prebuilt ``text()`` statement (its compiled-statement cache hit);
* asyncpg ``fetchrow`` (prepared once per connection, then cached).

Run: ``.venv/bin/python -m bench.statement_cost`` (BENCH_STATEMENTS, default 3000).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

WARMUP = 200


async def _measure(label: str, call: Callable[[], Awaitable[Any]], n: int) -> None:
    for _ in range(WARMUP):
        await call()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        await call()
    cpu_us = 1e6 * (time.process_time() - cpu) / n
    wall_us = 1e6 * (time.perf_counter() - wall) / n
    print(f"  {label:32} cpu {cpu_us:7.1f} us/statement   wall {wall_us:7.1f} us")


async def _compare(database_url: str, n: int) -> None:
    from sqlalchemy import select, text
    from sqlalchemy.ext.asyncio import create_async_engine

    from service.store.db import async_url
    from service.store.tables import operations

    engine = create_async_engine(async_url(database_url), pool_size=1)
    reader = engine.execution_options(isolation_level="AUTOCOMMIT")
    principal = uuid.uuid4()
    prebuilt = text(
        "SELECT * FROM operations WHERE tenant = :t AND principal_id = :p AND route = :r"
        " AND idempotency_key = :k"
    )
    raw_sql = (
        "SELECT * FROM operations WHERE tenant = $1 AND principal_id = $2 AND route = $3"
        " AND idempotency_key = $4"
    )
    try:
        async with reader.connect() as conn:

            def built() -> Awaitable[Any]:
                return conn.execute(
                    select(operations).where(
                        operations.c.tenant == "t",
                        operations.c.principal_id == principal,
                        operations.c.route == "r",
                        operations.c.idempotency_key == "k",
                    )
                )

            def cached() -> Awaitable[Any]:
                return conn.execute(prebuilt, {"t": "t", "p": principal, "r": "r", "k": "k"})

            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None

            def direct() -> Awaitable[Any]:
                fetched: Awaitable[Any] = raw.fetchrow(raw_sql, "t", principal, "r", "k")
                return fetched

            await _measure("SQLAlchemy Core, built per call", built, n)
            await _measure("SQLAlchemy text(), prebuilt", cached, n)
            await _measure("asyncpg fetchrow (prepared)", direct, n)
    finally:
        await engine.dispose()


def main() -> None:
    import uvloop

    from devstack import EmbeddedServices
    from service.store.migrate import upgrade

    n = int(os.environ.get("BENCH_STATEMENTS", "3000"))
    with (
        tempfile.TemporaryDirectory(prefix="settlement-statement-cost-") as data,
        EmbeddedServices(Path(data), durable=False, want_redis=False) as services,
    ):
        upgrade(services.database_url)
        print(f"{n} statements each, one connection, after {WARMUP} of warm-up")
        print("asyncio event loop:")
        asyncio.run(_compare(services.database_url, n))
        print("uvloop:")
        uvloop.run(_compare(services.database_url, n))


if __name__ == "__main__":
    main()
