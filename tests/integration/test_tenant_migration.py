"""Migration 0018 (the tenant in every key) on a filled database, while a writer of the
previous revision keeps writing (issue 38 item 1).

The database is migrated to 0017 and filled as ``make bench-scale`` fills it
(``bench.scale_fill``, smaller), plus superseded epochs, refused evidence about no operation
and accounts of several tenants. Then the upgrade to 0018 runs while a writer sends the
previous revision's statement shapes (0017's code: attempts, observations and epochs
inserted without a tenant, operations locked, written and attempts closed by id alone), and
keeps writing after it. The writer sees no error; every row ends with its operation's
tenant; the keys and the whole schema match the metadata; no row is lost or added.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from bench import fixtures
from bench.scale_fill import Owner, fill
from bench.stack import plain_url
from service.app.routes import SCHEMA as metadata
from service.store.db import async_url
from service.store.migrate import upgrade
from tests.conftest import Services, create_database

pytestmark = pytest.mark.integration

OPERATIONS = 20_000
EPOCHS = 2_000  # superseded epochs of filled operations
REFUSED = 500  # evidence about no operation here, from an observer of tenant "observed"
RETENTION = 86_400.0
TABLES = ("operations", "attempts", "observations", "operation_epochs", "accounts", "transfers")

# The previous revision's statements, in its shapes (service/store at 0017): a new
# operation and its attempt, the row locked by id, its CAS by id, the observation and the
# attempt's end without a tenant, a supersede's epoch without a tenant.
CLAIM = """
WITH claimed AS (
    INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,
        binding_generation, request_fingerprint, bound_principal_id,
        bound_credential_generation, state, revision, fencing_token, current_attempt_id,
        lease_expires_at)
    VALUES ($1, 'bench', $2, 'POST /v1/transfers', $3, 1, repeat('a', 64), $2, 1,
        'in_progress', 1, 1, $4, now() + interval '10 seconds')
    ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
    RETURNING id
)
INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
    lease_expires_at, started_at)
SELECT $4, claimed.id, 1, 1, 'lease', now() + interval '10 seconds', now() FROM claimed
RETURNING operation_id
"""
LOCK = "SELECT id, revision FROM operations WHERE id = $1 FOR UPDATE"
SETTLE = """
WITH written AS (
    UPDATE operations SET state = 'unknown', revision = revision + 1, updated_at = now()
     WHERE id = $1 AND revision = 1
    RETURNING id
), recorded AS (
    INSERT INTO observations (operation_id, source, kind, binding_generation, verified,
        stage, disposition, reason, revision_before, revision_after, attempt_id)
    SELECT written.id, 'attempt', 'unknown', 1, true, 'B', 'applied', 'timeout', 1, 2, $2
      FROM written
    RETURNING id
), closed AS (
    UPDATE attempts SET finished_at = now(), outcome = 'unknown' WHERE id = $2
)
SELECT id FROM recorded
"""
EPOCH = """
INSERT INTO operation_epochs (operation_id, binding_generation, request_fingerprint,
    bound_principal_id, bound_credential_generation, final_state, reason)
VALUES ($1, 7, repeat('a', 64), $2, 1, 'unknown', 'writer')
"""
ORPHAN = """
INSERT INTO observations (operation_id, source, kind, verified, stage, disposition, reason,
    detail)
VALUES (NULL, 'evidence', 'completed', false, 'A', 'quarantined', 'unknown-operation',
    jsonb_build_object('principal_id', $1::text))
"""


async def _counts(conn: asyncpg.Connection) -> dict[str, int]:
    return {table: await conn.fetchval(f"SELECT count(*) FROM {table}") for table in TABLES}


async def _setup(conn: asyncpg.Connection, principal: uuid.UUID, observer: uuid.UUID) -> None:
    await conn.execute(
        "INSERT INTO operation_epochs (operation_id, binding_generation, request_fingerprint,"
        " bound_principal_id, bound_credential_generation, final_state, reason)"
        " SELECT id, 1, request_fingerprint, bound_principal_id, 1, 'completed', 'filled'"
        " FROM operations ORDER BY id LIMIT $1",
        EPOCHS,
    )
    await conn.execute(
        "INSERT INTO observations (operation_id, source, kind, verified, stage, disposition,"
        " reason, detail) SELECT CASE WHEN i % 2 = 0 THEN gen_random_uuid() END, 'evidence',"
        " 'completed', false, 'A', 'quarantined', 'unknown-operation',"
        " jsonb_build_object('principal_id', $1::text) FROM generate_series(1, $2) AS i",
        str(observer),
        REFUSED,
    )


class Writer:
    """The previous revision's writes, one operation after another, until stopped."""

    def __init__(self, url: str, principal: uuid.UUID, observer: uuid.UUID) -> None:
        self.url, self.principal, self.observer = url, principal, observer
        self.written: dict[str, int] = dict.fromkeys(TABLES, 0)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.url, timeout=10, command_timeout=120)
        try:
            while not self.stop.is_set():
                await self._one(conn)
        finally:
            await conn.close()

    async def _one(self, conn: asyncpg.Connection) -> None:
        operation, attempt = uuid.uuid4(), uuid.uuid4()
        async with conn.transaction():
            claimed = await conn.fetchval(CLAIM, operation, self.principal, str(operation), attempt)
            assert claimed == operation
        async with conn.transaction():
            assert (await conn.fetchrow(LOCK, operation)) is not None
            assert (await conn.fetchval(SETTLE, operation, attempt)) is not None
            await conn.execute(EPOCH, operation, self.principal)
            await conn.execute(ORPHAN, str(self.observer))
        for table in ("operations", "attempts", "operation_epochs"):
            self.written[table] += 1
        self.written["observations"] += 2


def _diff(connection: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(connection), metadata))


async def test_0018_fills_every_tenant_online_under_the_previous_revisions_writes(
    services: Services,
) -> None:
    url = await create_database(services, "tenant_keys")
    await asyncio.to_thread(upgrade, url, "0017")
    plain = plain_url(url)
    fixture = await fixtures.create(plain)
    principal = uuid.UUID(fixture.principal_id)
    owner = Owner(fixtures.TENANT, principal, [fixtures.pair(p) for p in (1, 2, 3)])
    conn = await asyncpg.connect(plain, timeout=10, command_timeout=300)
    try:
        observer = await conn.fetchval(
            "INSERT INTO principals (id, tenant, name, role, key_hash)"
            " VALUES (gen_random_uuid(), 'observed', 'observer', 'observer', $1) RETURNING id",
            uuid.uuid4().bytes * 2,
        )
        await fill(
            conn, OPERATIONS, owners=[owner], now=datetime.now(UTC), retention=RETENTION,
            chunk=5_000, tenant=False,
        )  # fmt: skip
        await _setup(conn, principal, observer)
        before = await _counts(conn)

        writer = Writer(plain, principal, observer)
        writing = asyncio.create_task(writer.run())
        await asyncio.sleep(0.3)  # the writer is under way before the migration starts
        during = dict(writer.written)
        await asyncio.to_thread(upgrade, url, "0018")
        migrated = dict(writer.written)
        await asyncio.sleep(0.3)  # and keeps writing after it
        writer.stop.set()
        await writing  # raises what the writer met

        assert migrated["operations"] > during["operations"], "the writer wrote meanwhile"
        assert writer.written["operations"] > migrated["operations"], "and after"
        after = await _counts(conn)
        assert after == {table: before[table] + writer.written[table] for table in TABLES}

        for table in ("attempts", "operation_epochs", "observations"):
            wrong = await conn.fetchval(
                f"SELECT count(*) FROM {table} t LEFT JOIN operations o ON o.id = t.operation_id"
                " WHERE t.tenant IS DISTINCT FROM coalesce(o.tenant, 'observed')"
            )
            assert wrong == 0, f"{table}: {wrong} rows without their operation's tenant"
        keys = {
            row["conname"]: row["definition"]
            for row in await conn.fetch(
                "SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint"
                " WHERE contype IN ('p', 'u', 'f') AND conrelid::regclass::text = ANY($1)",
                list(TABLES),
            )
        }
        for table in TABLES:
            assert keys[f"pk_{table}"] == "PRIMARY KEY (tenant, id)"
        assert keys["fk_attempts_tenant_operations"] == (
            "FOREIGN KEY (tenant, operation_id) REFERENCES operations(tenant, id) ON DELETE CASCADE"
        )
        assert keys["fk_transfers_source_id_accounts"] == (
            "FOREIGN KEY (tenant, source_id) REFERENCES accounts(tenant, id)"
        )
        invalid = await conn.fetchval(
            "SELECT (SELECT count(*) FROM pg_constraint WHERE NOT convalidated)"
            " + (SELECT count(*) FROM pg_index WHERE NOT indisvalid)"
        )
        assert invalid == 0
    finally:
        await conn.close()

    engine = create_async_engine(async_url(url))
    try:
        async with engine.connect() as sa_conn:
            assert await sa_conn.run_sync(_diff) == []
    finally:
        await engine.dispose()
