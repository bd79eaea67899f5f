"""The pgbench rows of make bench run the server's own statements (bench.pgbench_sql): the
scripts written from today's SQL run under pgbench on the migrated schema, and a new
transfer's script settles transfers as the server does (the operation completed, one transfer,
the money moved)."""

from __future__ import annotations

from pathlib import Path

import asyncpg

from bench import fixtures, pgbench_sql
from bench.loadgen import run_pgbench
from bench.stack import plain_url
from service.store.migrate import upgrade
from tests.conftest import Services, fresh_database, run


def test_the_scripts_of_the_servers_statements_run_under_pgbench(
    services: Services, tmp_path: Path
) -> None:
    work = tmp_path
    url = fresh_database(services, "pgbench")
    upgrade(url)
    fixture = run(fixtures.create(plain_url(url)))
    scripts = pgbench_sql.write_scripts(work)
    variables = {
        "key_hash": fixture.key_hash,
        "tenant": fixtures.TENANT,
        "principal": fixture.principal_id,
        "pairs": str(fixtures.PAIRS),
        "seeded": "10",
    }
    for name in (pgbench_sql.NEW, pgbench_sql.READ):
        result = run_pgbench(
            str(scripts[name]),
            database_url=url,
            variables=variables,
            duration=1,
            clients=2,
            work_dir=work,
        )
        assert result.requests > 0 and not result.errors, (name, result)

    operations, moved, settled, total = run(_counts(plain_url(url)))
    assert operations > 0
    assert moved == operations == settled  # one transfer and one ended attempt per operation
    assert total == fixtures.BALANCE * fixtures.PAIRS * 2  # moved, never made or lost


async def _counts(url: str) -> tuple[int, int, int, int]:
    """Completed operations, transfers, ended attempts, and the tenant's money in all."""
    conn = await asyncpg.connect(url)
    try:
        operations = await conn.fetchval(
            "SELECT count(*) FROM operations WHERE state = 'completed' AND route = $1",
            fixtures.ROUTE,
        )
        moved = await conn.fetchval("SELECT count(*) FROM transfers")
        settled = await conn.fetchval(
            "SELECT count(*) FROM attempts WHERE outcome = 'completed' AND finished_at IS NOT NULL"
        )
        total = await conn.fetchval(
            "SELECT sum(balance) FROM accounts WHERE tenant = $1", fixtures.TENANT
        )
    finally:
        await conn.close()
    return operations, moved, settled, total
