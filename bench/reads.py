"""What one indexed read costs on each client path: the server's own read (SQLAlchemy on
asyncpg, inside BEGIN ... ROLLBACK), the same with AUTOCOMMIT, and asyncpg alone.

The read is ``PrincipalStore.authenticate`` (every request makes it). One connection, one call
at a time, BENCH_READS calls (3000) per path; CPU time per call of this process (the client)
and of PostgreSQL. Run: ``.venv/bin/python -m bench.reads``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import psutil
from sqlalchemy.ext.asyncio import AsyncEngine

from bench import fixtures
from bench.stack import Stack

AUTHENTICATE = (
    "SELECT id, tenant, name, role, key_hash, credential_generation, all_tenants, created_at, "
    "revoked_at FROM principals WHERE key_hash = $1 AND revoked_at IS NULL"
)


def postgres_cpu(stack: Stack) -> float:
    total = 0.0
    for p in stack.postgres_processes():
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            total += times.user + times.system
    return total


async def measure(
    stack: Stack, name: str, call: Callable[[], Awaitable[object]], n: int
) -> tuple[str, float, float]:
    await call()  # connect, prepare
    pg, own = postgres_cpu(stack), time.process_time()
    for _ in range(n):
        await call()
    return (
        name,
        1000 * (time.process_time() - own) / n,
        1000 * (postgres_cpu(stack) - pg) / n,
    )


async def paths(stack: Stack, n: int) -> list[tuple[str, float, float]]:
    from service.config import Settings
    from service.store.db import make_engine
    from service.store.principals import hash_key

    _, key = await fixtures.create_client(stack.database_url)
    engine = make_engine(Settings(), stack.database_url, pool_size=1)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    conn = await asyncpg.connect(stack.database_url)
    try:
        statement = await conn.prepare(AUTHENTICATE)
        digest = hash_key(key)

        async def in_transaction() -> object:
            async with conn.transaction():
                return await statement.fetch(digest)

        return [
            await measure(stack, "server: SQLAlchemy, BEGIN..ROLLBACK", _auth(engine, key), n),
            await measure(stack, "SQLAlchemy, AUTOCOMMIT", _auth(autocommit, key), n),
            await measure(stack, "asyncpg prepared, BEGIN..COMMIT", in_transaction, n),
            await measure(stack, "asyncpg prepared", lambda: statement.fetch(digest), n),
        ]
    finally:
        await conn.close()
        await engine.dispose()


def _auth(engine: AsyncEngine, key: str) -> Callable[[], Awaitable[object]]:
    from service.store.principals import PrincipalStore

    store = PrincipalStore(engine)
    return lambda: store.authenticate(key)


def main() -> int:
    n = int(os.environ.get("BENCH_READS", "3000"))
    with (
        tempfile.TemporaryDirectory(prefix="settlement-bench-reads-") as logs,
        Stack(Path(logs)) as stack,
    ):
        rows = asyncio.run(paths(stack, n))
    print(f"one authenticate read, {n} calls, CPU per call:")
    print(f"  {'path':<38} {'client ms':>10} {'postgres ms':>12}")
    for name, client, pg in rows:
        print(f"  {name:<38} {client:>10.3f} {pg:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
