"""Retention against real PostgreSQL (service/store/retention.py, service/app/purger.py):
expired terminal operations become tombstones in bounded batches, open ones never do, a
tombstoned scope is never claimed anew until the tombstone is forgotten."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.purger import Purger
from service.app.routes import SCHEMA
from service.core import Claim, OperationState, Scope
from service.store.outcomes import KeyExpired
from service.store.retention import Retention, RetentionStore
from service.store.rows import at
from service.store.settlement import SettlementStore
from service.store.tables import (
    accounts,
    attempts,
    observations,
    operation_epochs,
    operations,
    tombstones,
    transfers,
)
from service.telemetry import Metrics
from tests.citus_rules import Schema, spans_tenants, statement_findings
from tests.citus_statements import Recorder
from tests.integration.factories import (
    Clock,
    claim_request,
    count,
    make_principal,
    make_scope,
    rows,
)
from tests.integration.test_hot_path import claimed, key_hash, opening

pytestmark = pytest.mark.integration

RETENTION = Retention(default=60.0, tombstone=600.0, routes={"POST /v1/accounts": 120.0})


@pytest.fixture
def retention_store(engine: AsyncEngine, clock: Clock, pool: Any) -> SettlementStore:
    return SettlementStore(engine, clock=clock, pool=pool, retention=RETENTION)


@pytest.fixture
def tombstone_store(engine: AsyncEngine) -> RetentionStore:
    return RetentionStore(engine, RETENTION)


def purger(tombstone_store: RetentionStore, clock: Clock, batch: int = 500) -> Purger:
    return Purger(tombstone_store, Metrics(), interval=1.0, clock=clock, batch=batch)


async def settled_transfer(
    store: SettlementStore, scope: Scope, clock: Clock
) -> tuple[uuid.UUID, uuid.UUID]:
    """A completed operation of ``scope`` whose effect wrote an account: (operation, account)."""
    attempt, record = await claimed(store, scope, clock)
    statement, account = opening(attempt, record)
    done = await store.settle_local(
        uuid.UUID(attempt.reservation.operation_id),
        attempt,
        statement,
        tenant=scope.tenant,
        route=scope.route,
    )
    assert done.record.state is OperationState.COMPLETED
    return uuid.UUID(attempt.reservation.operation_id), account.id


async def test_a_terminal_row_expires_after_its_routes_retention(
    engine: AsyncEngine, retention_store: SettlementStore, clock: Clock, principal_id: uuid.UUID
) -> None:
    for route, kept in (("POST /v1/transfers", 60.0), ("POST /v1/accounts", 120.0)):
        scope = make_scope(principal_id, route=route)
        op, _ = await settled_transfer(retention_store, scope, clock)
        (row,) = await rows(engine, operations, operations.c.id == op)
        assert row["expires_at"] == at(clock.now + kept)


async def test_a_purge_keeps_a_tombstone_and_the_effect_and_drops_the_rest(
    engine: AsyncEngine,
    retention_store: SettlementStore,
    tombstone_store: RetentionStore,
    clock: Clock,
    principal_id: uuid.UUID,
) -> None:
    scope = make_scope(principal_id)
    op, account_id = await settled_transfer(retention_store, scope, clock)
    fresh, _ = await settled_transfer(retention_store, make_scope(principal_id), clock)
    clock.advance(59)  # just before expiry: nothing of this principal goes
    await purger(tombstone_store, clock).run_once()
    assert await count(engine, operations, operations.c.principal_id == principal_id) == 2

    clock.advance(2)  # just after
    done = await purger(tombstone_store, clock).run_once()
    assert done.operations >= 2
    assert await count(engine, operations, operations.c.id.in_([op, fresh])) == 0
    for table in (attempts, operation_epochs):
        assert await count(engine, table, table.c.operation_id == op) == 0
    assert await count(engine, observations, observations.c.operation_id == op) == 0
    # the effect stays, naming its operation
    (account,) = await rows(engine, accounts, accounts.c.id == account_id)
    assert account["operation_id"] == op
    (kept,) = await rows(engine, tombstones, tombstones.c.operation_id == op)
    assert (kept["tenant"], kept["principal_id"], kept["route"], kept["idempotency_key"]) == (
        scope.tenant,
        scope.principal_id,
        scope.route,
        scope.idempotency_key,
    )
    assert kept["final_state"] == "completed"
    assert kept["request_fingerprint"] == "f" * 64
    assert kept["expired_at"] == at(clock.now - 2 - 59 + 60)
    assert kept["forget_at"] == at(clock.now + 600)

    # the tombstone is what identify sees, and what a claim runs into
    found = await retention_store.reads.identify(
        key_hash(principal_id), scope.route, scope.idempotency_key
    )
    assert found is not None and found[1] is None
    assert found[2] is not None and found[2].operation_id == op  # it stands
    with pytest.raises(KeyExpired):  # the one-statement insert refuses, then the locked claim
        await retention_store.claim(
            scope, claim_request(principal_id, clock), lease_token="t", assume_absent=True
        )
    assert await count(engine, operations, operations.c.principal_id == principal_id) == 0

    # at its forget_at the key is new again: identify reads no tombstone, and a claim runs
    clock.advance(600)
    found = await retention_store.reads.identify(
        key_hash(principal_id), scope.route, scope.idempotency_key
    )
    assert found is not None and found[1] is None and found[2] is None
    again = await retention_store.claim(
        scope, claim_request(principal_id, clock), lease_token="t", assume_absent=True
    )
    assert again.record is not None
    assert await count(engine, operations, operations.c.principal_id == principal_id) == 1


async def test_open_operations_are_never_purged(
    engine: AsyncEngine,
    retention_store: SettlementStore,
    tombstone_store: RetentionStore,
    clock: Clock,
    principal_id: uuid.UUID,
) -> None:
    ids = []
    for state in ("in_progress", "unknown", "conflict"):
        attempt, _ = await claimed(retention_store, make_scope(principal_id), clock)
        ids.append(uuid.UUID(attempt.reservation.operation_id))
        values: dict[str, Any] = {"state": state, "expires_at": at(clock.now - 1)}
        if state == "conflict":
            values.update(
                result_status=201,
                result_content_type="application/json",
                result_body=b"{}",
                result_digest="d",
                conflict={"digests": ["a", "b"]},
            )
        async with engine.begin() as conn:
            await conn.execute(update(operations).where(operations.c.id == ids[-1]).values(values))
    for _ in range(5):
        clock.advance(10**6)
        await purger(tombstone_store, clock).run_once()
    assert await count(engine, operations, operations.c.id.in_(ids)) == 3
    assert await count(engine, tombstones, tombstones.c.operation_id.in_(ids)) == 0


async def test_a_forgotten_tombstone_makes_the_key_new_again(
    engine: AsyncEngine,
    retention_store: SettlementStore,
    tombstone_store: RetentionStore,
    clock: Clock,
    principal_id: uuid.UUID,
) -> None:
    scope = make_scope(principal_id)
    op, _ = await settled_transfer(retention_store, scope, clock)
    clock.advance(61)
    await purger(tombstone_store, clock).run_once()
    clock.advance(599)
    await purger(tombstone_store, clock).run_once()
    assert await count(engine, tombstones, tombstones.c.operation_id == op) == 1
    with pytest.raises(KeyExpired):
        await retention_store.claim(scope, claim_request(principal_id, clock), lease_token="t")

    clock.advance(2)
    done = await purger(tombstone_store, clock).run_once()
    assert done.tombstones >= 1
    assert await count(engine, tombstones, tombstones.c.operation_id == op) == 0
    again = await retention_store.claim(
        scope, claim_request(principal_id, clock), lease_token="t", assume_absent=True
    )
    assert isinstance(again.decision, Claim) and again.record is not None
    assert again.record.reservation.operation_id != str(op)


async def test_a_stale_tombstone_does_not_stop_a_new_claim_and_is_replaced_at_its_purge(
    engine: AsyncEngine,
    retention_store: SettlementStore,
    tombstone_store: RetentionStore,
    clock: Clock,
    principal_id: uuid.UUID,
) -> None:
    scope = make_scope(principal_id)
    first, _ = await settled_transfer(retention_store, scope, clock)
    clock.advance(61)
    await purger(tombstone_store, clock).run_once()
    clock.advance(601)  # past forget_at, but no pass has deleted the tombstone yet
    second, _ = await settled_transfer(retention_store, scope, clock)
    clock.advance(61)
    # the second operation's purge deletes the old tombstone first, then tombstones it
    await purger(tombstone_store, clock).run_once()
    (kept,) = await rows(
        engine,
        tombstones,
        tombstones.c.principal_id == principal_id,
        tombstones.c.idempotency_key == scope.idempotency_key,
    )
    assert kept["operation_id"] == second != first


async def test_a_purge_batch_is_bounded_and_several_purgers_share_the_work(
    engine: AsyncEngine,
    open_engine: Any,
    retention_store: SettlementStore,
    clock: Clock,
    principal_id: uuid.UUID,
) -> None:
    made = [(await settled_transfer(retention_store, make_scope(principal_id), clock))[0]]
    for _ in range(11):
        made.append((await settled_transfer(retention_store, make_scope(principal_id), clock))[0])
    clock.advance(61)
    store = RetentionStore(engine, RETENTION)
    page = await store.purge(5, at(clock.now))
    assert (page.purged, page.full) == (5, True)
    # two processes' purgers at once: every row goes exactly once
    other = RetentionStore(open_engine(), RETENTION)
    pages = await asyncio.gather(*(s.purge(3, at(clock.now)) for s in (store, other, store)))
    rest = await purger(store, clock).run_once()
    assert sum(p.purged for p in pages) + rest.operations + 5 >= 12
    assert await count(engine, operations, operations.c.id.in_(made)) == 0
    assert await count(engine, tombstones, tombstones.c.operation_id.in_(made)) == 12


# -- a large backlog --------------------------------------------------------------------------

BACKLOG = 100_000
# how often the concurrent reader asks for its own (unexpired) operation while the purge runs
READ_EVERY = 0.005


async def test_a_backlog_of_100000_expired_rows_is_purged_in_short_batches_while_replays_answer(
    engine: AsyncEngine,
    retention_store: SettlementStore,
    tombstone_store: RetentionStore,
    clock: Clock,
    principal_id: uuid.UUID,
) -> None:
    """The figures (printed with -s) are reported in the retention issue's note; the test
    asserts what does not depend on the machine's speed: every batch holds at most its size,
    every row goes, and a replay of another key answers from its row throughout."""
    owner = await make_principal(engine)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                """
INSERT INTO operations (id, tenant, principal_id, route, idempotency_key, binding_generation,
    request_fingerprint, bound_principal_id, bound_credential_generation, state, revision,
    fencing_token, result_status, result_content_type, result_body, result_digest,
    created_at, updated_at, expires_at)
SELECT gen_random_uuid(), 'acme', :owner, 'POST /v1/transfers', 'bulk-' || g, 1, :fp,
       :owner, 1, 'completed', 2, 1, 201, 'application/json', '\\x7b7d'::bytea, 'd',
       :then, :then, :then
  FROM generate_series(1, :n) AS g
"""
            ),
            {"owner": owner, "fp": "f" * 64, "then": at(clock.now), "n": BACKLOG},
        )
    kept_scope = make_scope(principal_id)
    await settled_transfer(retention_store, kept_scope, clock)
    clock.advance(61)
    # the replayed row must outlive this purge: push its expiry out
    async with engine.begin() as conn:
        await conn.execute(
            update(operations)
            .where(operations.c.principal_id == principal_id)
            .values(expires_at=at(clock.now + 3600))
        )

    batches: list[float] = []
    store = tombstone_store
    original = store.purge

    async def timed(batch: int, now: Any) -> Any:
        started = time.perf_counter()
        page = await original(batch, now)
        batches.append(time.perf_counter() - started)
        assert page.purged <= batch
        return page

    store.purge = timed  # type: ignore[method-assign]
    reads: list[float] = []
    done = asyncio.Event()

    async def replays() -> None:
        while not done.is_set():
            started = time.perf_counter()
            found = await retention_store.reads.identify(
                key_hash(principal_id), kept_scope.route, kept_scope.idempotency_key
            )
            reads.append(time.perf_counter() - started)
            assert found is not None and found[1] is not None
            assert found[1].state is OperationState.COMPLETED
            await asyncio.sleep(READ_EVERY)

    reader = asyncio.create_task(replays())
    started = time.perf_counter()
    purged = 0
    worker = purger(store, clock)
    while True:
        one = await worker.run_once()
        purged += one.operations
        if not one.more:
            break
    total = time.perf_counter() - started
    done.set()
    await reader

    assert purged >= BACKLOG
    assert await count(engine, operations, operations.c.principal_id == owner) == 0
    assert await count(engine, tombstones, tombstones.c.principal_id == owner) == BACKLOG
    assert len(reads) > 10, "the replays did not run alongside the purge"
    print(
        f"\npurged {purged} in {total:.1f} s, {len(batches)} batches of <= 500: "
        f"median {statistics.median(batches) * 1000:.0f} ms, max {max(batches) * 1000:.0f} ms; "
        f"{len(reads)} replays alongside: median {statistics.median(reads) * 1000:.1f} ms, "
        f"max {max(reads) * 1000:.1f} ms"
    )


async def held_purge(engine: AsyncEngine, op: uuid.UUID, forget_at: Any) -> Any:
    """A purge of ``op`` begun and not committed (what :data:`_PURGE` does to one row):
    its row deleted, its tombstone written. Returns the open connection; commit it."""
    conn = await engine.connect()
    await conn.begin()
    await conn.execute(observations.delete().where(observations.c.operation_id == op))
    gone = (
        await conn.execute(
            operations.delete()
            .where(operations.c.id == op)
            .returning(
                operations.c.tenant,
                operations.c.principal_id,
                operations.c.route,
                operations.c.idempotency_key,
                operations.c.request_fingerprint,
                operations.c.expires_at,
            )
        )
    ).one()
    await conn.execute(
        tombstones.insert().values(
            tenant=gone.tenant,
            principal_id=gone.principal_id,
            route=gone.route,
            idempotency_key=gone.idempotency_key,
            operation_id=op,
            request_fingerprint=gone.request_fingerprint,
            final_state="completed",
            expired_at=gone.expires_at,
            forget_at=forget_at,
        )
    )
    return conn


async def blocked_on_a_lock(engine: AsyncEngine, what: str) -> None:
    """Until a statement containing ``what`` waits for a lock (it found the held purge)."""
    for _ in range(200):
        async with engine.connect() as conn:
            waiting = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE :what"
                    ),
                    {"what": f"%{what}%"},
                )
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no statement with {what!r} waited for the purge")


@pytest.mark.parametrize("way", ["claim", "claim-and-settle", "locked-claim"])
async def test_a_claim_that_waits_for_the_purge_of_its_scopes_row_never_inserts_a_new_one(
    engine: AsyncEngine,
    open_engine: Any,
    retention_store: SettlementStore,
    clock: Clock,
    principal_id: uuid.UUID,
    way: str,
) -> None:
    """The claim's statement begins while the scope's expired row still stands (its snapshot
    has the row and no tombstone); its insert waits for the purge deleting that row, which
    then commits the tombstone. The claim must answer the expiry, and write nothing."""
    from tests.integration.test_hot_path import new_transfer, two_accounts

    scope = make_scope(principal_id)
    op, _ = await settled_transfer(retention_store, scope, clock)
    ids = await two_accounts(engine, 100)
    clock.advance(61)
    purge = await held_purge(open_engine(), op, at(clock.now + 600))
    request = claim_request(principal_id, clock)
    if way == "claim-and-settle":
        claiming = retention_store.claim_and_settle_local(
            scope, request, new_transfer(ids, 10), lease_token="t", route=scope.route
        )
    else:
        claiming = retention_store.claim(
            scope, request, lease_token="t", assume_absent=way == "claim"
        )
    task = asyncio.ensure_future(claiming)
    # pg_stat_activity keeps a query's first 1024 bytes: the one statement's insert into
    # operations comes after the transfer's guard, which it opens with (only the held purge
    # holds a lock here, so its wait is the insert's)
    waiting = "FROM accounts" if way == "claim-and-settle" else "operations"
    try:
        await blocked_on_a_lock(engine, waiting)
    finally:
        await purge.commit()
        await purge.close()
    with pytest.raises(KeyExpired) as expired:
        await task
    assert expired.value.operation_id == op
    assert await count(engine, operations, operations.c.principal_id == principal_id) == 0
    assert await count(engine, transfers, transfers.c.operation_id == request.new_operation_id) == 0


async def test_the_purge_and_the_forgetting_go_tenant_by_tenant(
    engine: AsyncEngine,
    retention_store: SettlementStore,
    tombstone_store: RetentionStore,
    clock: Clock,
) -> None:
    """Two tenants' expired operations are both purged in one pass, and their tombstones both
    forgotten; every statement that locks or deletes is pinned to one tenant, and what finds
    the work across tenants is a read marked so (docs/scaling.md, Background jobs)."""
    made = {}
    for _ in range(2):
        tenant = f"purge-{uuid.uuid4().hex[:8]}"
        principal_id = await make_principal(engine, tenant)
        scope = make_scope(principal_id, tenant=tenant)
        made[tenant] = (await settled_transfer(retention_store, scope, clock))[0]
    clock.advance(61)
    schema = Schema.of(SCHEMA)
    with Recorder() as seen:
        worker = purger(tombstone_store, clock)
        while (await worker.run_once()).more:
            pass
        assert await count(engine, operations, operations.c.id.in_(made.values())) == 0
        for tenant, op in made.items():
            (kept,) = await rows(engine, tombstones, tombstones.c.operation_id == op)
            assert kept["tenant"] == tenant
        clock.advance(600)
        worker = purger(tombstone_store, clock)
        while (await worker.run_once()).more:  # other tests' tombstones go too
            pass
        gone = tombstones.c.operation_id.in_(made.values())
        assert await count(engine, tombstones, gone) == 0
    jobs = [sql for sql in seen.executed if "DELETE FROM" in sql and "WITH doomed" in sql]
    assert any("INTO tombstones" in sql for sql in jobs) and len(jobs) >= 2
    for sql in jobs:
        if "feed_" not in sql:  # the feeds' own tables are local, not distributed
            assert statement_findings("purge", sql, schema) == [], sql
    finders = [sql for sql in seen.executed if "ORDER BY expires_at" in sql]
    finders += [sql for sql in seen.executed if "ORDER BY forget_at" in sql]
    assert len(finders) >= 2 and all(spans_tenants(sql) for sql in finders), finders
