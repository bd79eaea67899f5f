"""A migration's DDL gives way to a long reader (service.store.online_ddl.briefly): while it
waits for the table's lock, a server's statements on the table are not queued behind it for
longer than its short lock wait, and it goes through once the reader ends."""

from __future__ import annotations

import asyncio

import asyncpg

from service.store.migrate import upgrade
from service.store.pool import plain_dsn
from tests.conftest import Services, create_database

# a server's statement bound here: above the DDL's lock wait (500 ms), below a queue's length
STATEMENT_TIMEOUT = "2s"
# bound of the waits on observable state below
PATIENCE = 30.0

WAITING = """SELECT count(*) FROM pg_locks
             WHERE relation = 'operations'::regclass AND mode = 'AccessExclusiveLock'
               AND NOT granted"""


async def test_0017_gives_way_to_a_long_reader_and_goes_through_after_it(
    services: Services,
) -> None:
    url = await create_database(services, "online_ddl")
    await asyncio.to_thread(upgrade, url, "0016")
    reader = await asyncpg.connect(plain_dsn(url))
    server = await asyncpg.connect(plain_dsn(url))
    try:
        held = reader.transaction()
        await held.start()
        await reader.fetchval("SELECT count(*) FROM operations")  # holds its lock
        migrating = asyncio.create_task(asyncio.to_thread(upgrade, url, "0017"))
        async with asyncio.timeout(PATIENCE):  # until 0017 asks for the table's lock
            while True:
                if await server.fetchval(WAITING):
                    break
                await asyncio.sleep(0.02)
        await server.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        for _ in range(5):  # a server's one-row reads go on meanwhile
            await server.fetchval("SELECT 1 FROM operations WHERE id = gen_random_uuid()")
        assert not migrating.done()  # still giving way
        await held.rollback()  # the reader ends
        await asyncio.wait_for(migrating, PATIENCE)
        comment = await server.fetchval(
            "SELECT col_description('operations'::regclass, attnum) FROM pg_attribute "
            "WHERE attrelid = 'operations'::regclass AND attname = 'canonical_request'"
        )
        assert comment is not None and comment.startswith("What the request fingerprint")
    finally:
        await reader.close()
        await server.close()
