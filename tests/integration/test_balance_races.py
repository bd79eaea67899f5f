"""Transfers racing near the balance limit, on real PostgreSQL, through both ways the store
moves money: the one statement of a new operation (claim, effect and settlement), and the
locked phase after a claim.

Each race is made deterministic with a barrier: a concurrent credit (or debit) of the source
account is written and held open in a transaction of the test's own; the transfers are
started and the test waits until every one of them waits for that row's lock (seen in
``pg_stat_activity``); then the credit commits. Every transfer's statement therefore began
before the credit committed and judges the account after it, which is the interleaving that
answered 500 (a CHECK violation) when the writes were computed from the statement's snapshot
instead of the rows the guard locked.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.store.pool import make_pool
from service.store.settlement import SettlementStore
from service.store.tables import transfers
from tests.integration.factories import Clock, claim_request, count, make_principal, make_scope
from tests.integration.test_hot_path import (
    ROUTE,
    balances,
    claimed,
    moving,
    new_transfer,
    two_accounts,
)
from tests.locks import lock_waiters

pytestmark = pytest.mark.integration

# How long the transfers may wait behind the held row lock, and the test for them to queue
# there: far above what queuing takes (milliseconds).
QUEUE_WAIT = 20.0
# Hot connections of the racing store: one per racer, and one for the fallback's claims.
POOL = 8
# Rounds of each race: the barrier makes one round deterministic; a few rounds cover the
# order in which PostgreSQL grants the queued locks.
ROUNDS = 3

Way = Callable[[SettlementStore, Clock, uuid.UUID, list[uuid.UUID], int], Awaitable[str]]


async def _new_operation(
    store: SettlementStore, clock: Clock, principal: uuid.UUID, ids: list[uuid.UUID], amount: int
) -> str:
    """The one statement of a new operation; when it writes nothing, the claim and the
    locked phase (as the server does)."""
    scope = make_scope(principal)
    done = await store.claim_and_settle_local(
        scope,
        claim_request(principal, clock),
        new_transfer(ids, amount),
        lease_token="t",
        route=ROUTE,
    )
    if done is not None:
        return done[1].record.state.value
    return await _locked_phase(store, clock, principal, ids, amount, scope=scope)


async def _locked_phase(
    store: SettlementStore,
    clock: Clock,
    principal: uuid.UUID,
    ids: list[uuid.UUID],
    amount: int,
    *,
    scope: Any = None,
) -> str:
    attempt, record = await claimed(store, scope or make_scope(principal), clock)
    settled = await store.settle_local(
        uuid.UUID(attempt.reservation.operation_id),
        attempt,
        moving(attempt, record, ids, amount),
        tenant="acme",
        route=ROUTE,
    )
    return settled.record.state.value


WAYS: dict[str, Way] = {
    "one-statement-new": _new_operation,
    "locked-phase": _locked_phase,
}


@pytest.fixture
async def holder(migrated_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The test's own connection, which writes the concurrent credit or debit."""
    conn = await asyncpg.connect(migrated_url.replace("postgresql+asyncpg://", "postgresql://"))
    yield conn
    await conn.close()


@pytest.fixture
async def patient_store(
    engine: AsyncEngine, clock: Clock, migrated_url: str
) -> AsyncIterator[SettlementStore]:
    """A store whose hot connections wait for a row lock as long as the barrier holds it
    (the server's lock timeout is 1 s), enough of them for every racer at once."""
    settings = Settings.from_env(
        {
            "SETTLEMENT_DB_LOCK_TIMEOUT": str(QUEUE_WAIT),
            "SETTLEMENT_DB_STATEMENT_TIMEOUT": str(2 * QUEUE_WAIT),
        }
    )
    pool = await make_pool(settings, migrated_url, size=POOL)
    yield SettlementStore(engine, clock=clock, pool=pool)
    await pool.close()


async def _race(
    store: SettlementStore,
    engine: AsyncEngine,
    clock: Clock,
    holder: asyncpg.Connection,
    way: Way,
    *,
    opening: int,
    change: int,
    amount: int,
    racers: int,
) -> tuple[list[str], list[uuid.UUID]]:
    """``racers`` transfers of ``amount`` out of an account opened with ``opening``, all
    queued behind a held change of ``change`` to that account, which then commits."""
    principal = await make_principal(engine)
    ids = await two_accounts(engine, opening)
    destinations = [ids[1]] + [(await two_accounts(engine, 0))[1] for _ in range(racers - 1)]
    async with holder.transaction():
        await holder.execute(
            "UPDATE accounts SET balance = balance + $1 WHERE id = $2", change, ids[0]
        )
        started = [
            asyncio.ensure_future(way(store, clock, principal, [ids[0], destination], amount))
            for destination in destinations
        ]
        await lock_waiters(holder, racers, patience=QUEUE_WAIT)
    answers = await asyncio.gather(*started)
    return answers, [ids[0], *destinations]


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("racers", [2, 5])
async def test_transfers_funded_by_a_credit_that_commits_while_they_wait_all_go_through(
    patient_store: SettlementStore,
    clock: Clock,
    holder: asyncpg.Connection,
    engine: AsyncEngine,
    way: str,
    racers: int,
) -> None:
    """Credit then debit: the account held 0 when every transfer's statement began; the
    credit that committed while they waited funds all of them. None may be refused (a false
    402) and none may fail (the CHECK violation, a 500)."""
    for _ in range(ROUNDS):
        answers, ids = await _race(
            patient_store,
            engine,
            clock,
            holder,
            WAYS[way],
            opening=0,
            change=100 * racers,
            amount=100,
            racers=racers,
        )
        assert answers == ["completed"] * racers
        found = await balances(engine, ids)
        assert found == [0] + [100] * racers
        assert await count(engine, transfers, transfers.c.source_id == ids[0]) == racers


@pytest.mark.parametrize("way", list(WAYS))
@pytest.mark.parametrize("racers", [2, 5])
async def test_transfers_whose_sum_exceeds_the_balance_go_through_exactly_as_far_as_it_allows(
    patient_store: SettlementStore,
    clock: Clock,
    holder: asyncpg.Connection,
    engine: AsyncEngine,
    way: str,
    racers: int,
) -> None:
    """The account held 50 when the statements began; the held credit of 100 commits while
    they wait: 150 covers exactly one transfer of 100 (and never two), the others fail
    with insufficient funds judged on the balance at that moment (50)."""
    for _ in range(ROUNDS):
        answers, ids = await _race(
            patient_store,
            engine,
            clock,
            holder,
            WAYS[way],
            opening=50,
            change=100,
            amount=100,
            racers=racers,
        )
        assert sorted(answers) == ["completed"] + ["failed"] * (racers - 1)
        found = await balances(engine, ids)
        assert found[0] == 50 and min(found) >= 0 and sum(found) == 150
        assert await count(engine, transfers, transfers.c.source_id == ids[0]) == 1


@pytest.mark.parametrize("way", list(WAYS))
async def test_a_debit_that_commits_while_transfers_wait_leaves_only_what_is_left(
    patient_store: SettlementStore,
    clock: Clock,
    holder: asyncpg.Connection,
    engine: AsyncEngine,
    way: str,
) -> None:
    """Debit then debit: the account held 300 when the statements began; a debit of 150
    commits while 3 transfers of 100 wait: exactly one goes through, the balance ends at 50."""
    answers, ids = await _race(
        patient_store,
        engine,
        clock,
        holder,
        WAYS[way],
        opening=300,
        change=-150,
        amount=100,
        racers=3,
    )
    assert sorted(answers) == ["completed", "failed", "failed"]
    assert (await balances(engine, ids))[0] == 50
    assert await count(engine, transfers, transfers.c.source_id == ids[0]) == 1
