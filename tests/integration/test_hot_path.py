"""The hot path's statements (service/store/hot.py) against real PostgreSQL: the principal
and its scope's row in one read, a new claim in one statement, a local effect (its SQL, an
``EffectStatement``) settled with it under the row's lock, and a new operation claimed, run
and settled in one statement; a refusal of the effect's guard is settled as the ``failed``
outcome in its place, with nothing of the effect written."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from msgspec.structs import replace
from sqlalchemy import bindparam, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.core import (
    Claim,
    ConflictInfo,
    ObservationKind,
    OperationState,
    Record,
    Scope,
    Source,
    Supersede,
)
from service.core import Observation as CoreObservation
from service.domain import ledger
from service.store.db import PoolTimeout
from service.store.hot_sql import LOCK, Prepared
from service.store.pool import make_pool, plain_dsn
from service.store.rows import record_from_row, record_values
from service.store.settlement import AttemptRef, EffectStatement, SettlementStore
from service.store.tables import (
    accounts,
    attempts,
    observations,
    operations,
    principals,
    transfers,
)
from tests.integration.factories import (
    Clock,
    claim_request,
    completed,
    count,
    make_principal,
    make_scope,
    new_operation,
    rows,
)
from tests.unit.factories import make_observation

pytestmark = pytest.mark.integration

# the route whose retention a settled row starts (the default one here)
ROUTE = "POST /v1/accounts"


def key_hash(principal_id: uuid.UUID) -> bytes:
    """The key hash ``make_principal`` gives a principal."""
    return hashlib.sha256(principal_id.bytes).digest()


async def claimed(store: SettlementStore, scope: Scope, clock: Clock) -> tuple[AttemptRef, Record]:
    """A NEW claim through the one-statement insert, as the server makes it: the attempt
    and the row its claim wrote."""
    outcome = await store.claim(
        scope, claim_request(scope.principal_id, clock), lease_token="t", assume_absent=True
    )
    assert isinstance(outcome.decision, Claim) and outcome.record is not None
    assert outcome.attempt_id is not None
    attempt = AttemptRef(
        attempt_id=outcome.attempt_id,
        reservation=outcome.record.reservation,
        fencing_token=outcome.record.fencing_token,
    )
    return attempt, outcome.record


def refusals(record: Record, said: list[tuple[str, str]]) -> Any:
    """An ``EffectStatement``'s ``refused``: a ``failed`` report; keeps the slug and detail."""

    def refused(slug: str, detail: str) -> CoreObservation:
        said.append((slug, detail))
        return make_observation(
            "failed", reservation=record.reservation, fencing_token=record.fencing_token
        )

    return refused


def opening(
    attempt: AttemptRef, record: Record, generation: int = 1
) -> tuple[EffectStatement, ledger.Account]:
    """``POST /v1/accounts``'s effect for ``attempt``: one account of the operation's epoch."""
    op = uuid.UUID(attempt.reservation.operation_id)
    request = ledger.AccountRequest(currency="EUR", opening_balance=7)
    params, account = ledger.create_account_values("acme", op, generation, request)
    observation = completed(record, fencing_token=attempt.fencing_token)
    return EffectStatement(ledger.OPEN_ACCOUNT, params, observation, refusals(record, [])), account


async def test_identify_reads_the_principal_and_its_scope_row_in_one_go(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    digest = key_hash(scope.principal_id)
    found = await store.reads.identify(digest, scope.route, scope.idempotency_key)
    assert found is not None
    principal, record, tombstone = found
    assert (principal.id, principal.tenant, record) == (scope.principal_id, "acme", None)
    assert tombstone is None

    _, row = await claimed(store, scope, clock)
    found = await store.reads.identify(digest, scope.route, scope.idempotency_key)
    assert found is not None and found[1] == row
    # another route or key of the same principal is another scope
    other = await store.reads.identify(digest, "POST /v1/accounts", scope.idempotency_key)
    assert other is not None and other[1] is None
    # a wrong key, and a revoked one, identify nobody
    assert await store.reads.identify(b"\x00" * 32, scope.route, scope.idempotency_key) is None
    async with engine.begin() as conn:
        await conn.execute(
            update(principals)
            .where(principals.c.id == scope.principal_id)
            .values(revoked_at=datetime.now(UTC))
        )
    assert await store.reads.identify(digest, scope.route, scope.idempotency_key) is None


async def test_a_second_new_claim_of_a_scope_writes_nothing_and_locks_the_row_instead(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    _, first = await claimed(store, scope, clock)
    # the second claimer read no row too, but the first inserted meanwhile: its one-statement
    # insert does nothing and the locked claim answers from the row (a live lease: busy)
    second = await store.claim(
        scope, claim_request(scope.principal_id, clock), lease_token="u", assume_absent=True
    )
    assert not isinstance(second.decision, Claim)
    scoped = operations.c.idempotency_key == scope.idempotency_key
    assert await count(engine, operations, scoped) == 1
    op = uuid.UUID(first.reservation.operation_id)
    assert await count(engine, attempts, attempts.c.operation_id == op) == 1


async def test_a_claimed_row_is_settled_with_its_effect_under_its_lock(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)
    statement, account = opening(attempt, record)
    settled = await store.settle_local(op, attempt, statement, tenant="acme", route=ROUTE)
    assert settled.record.state is OperationState.COMPLETED and settled.record.revision == 2
    (opened,) = await rows(engine, accounts, accounts.c.operation_id == op)
    assert (opened["id"], opened["balance"], opened["binding_generation"]) == (account.id, 7, 1)
    (observed,) = await rows(engine, observations, observations.c.operation_id == op)
    assert (observed["disposition"], observed["revision_before"], observed["revision_after"]) == (
        "applied",
        1,
        2,
    )
    (attempt_row,) = await rows(engine, attempts, attempts.c.operation_id == op)
    assert (attempt_row["outcome"], attempt_row["finished_at"] is not None) == ("completed", True)


async def test_a_row_demoted_meanwhile_is_settled_on_its_current_revision_and_written_once(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)
    # the sweeper found the lease gone and demoted the row (same epoch, same fencing token)
    clock.advance(60)
    demotion = CoreObservation(
        reservation=attempt.reservation, kind=ObservationKind.UNKNOWN, source=Source.SWEEPER
    )
    assert (await store.settle(op, demotion)).record.state is OperationState.UNKNOWN
    statement, _ = opening(attempt, record)
    settled = await store.settle_local(op, attempt, statement, tenant="acme", route=ROUTE)
    # decided on the row as locked (revision 2): the completed outcome applied over unknown
    assert await count(engine, accounts, accounts.c.operation_id == op) == 1
    assert settled.record.state is OperationState.COMPLETED and settled.record.revision == 3


async def test_an_attempt_of_a_superseded_epoch_commits_nothing(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)

    async def nobody_holds(scopes: list[Scope]) -> list[float | None]:
        return [None for _ in scopes]

    admin = await make_principal(engine)
    superseded = await store.supersede(
        op,
        reason="test",
        admin_id=admin,
        request_fingerprint=None,
        rebind=False,
        force=True,
        lease_remaining=nobody_holds,
    )
    assert isinstance(superseded, Supersede)
    statement, _ = opening(attempt, record)
    settled = await store.settle_local(op, attempt, statement, tenant="acme", route=ROUTE)
    # the locked row is of another epoch: the attempt's probe is settled (ignored) and the
    # effect never runs
    assert await count(engine, accounts, accounts.c.operation_id == op) == 0
    assert settled.decision.disposition.value in ("ignored", "quarantined")
    current = await store.reads.get(op)
    assert current is not None and current.state is OperationState.UNKNOWN
    assert current.reservation.binding_generation == 2


async def test_a_late_attempt_of_a_taken_over_operation_is_ignored_and_writes_nothing(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    stale, stale_row = await claimed(store, scope, clock)
    op = uuid.UUID(stale.reservation.operation_id)
    # the lease ran out; a retry took the operation over and completed it
    clock.advance(60)
    taken = await store.claim(
        scope, claim_request(scope.principal_id, clock), lease_token="v", holds_lease=True
    )
    assert isinstance(taken.decision, Claim) and taken.record is not None
    assert taken.attempt_id is not None
    owner = AttemptRef(
        attempt_id=taken.attempt_id,
        reservation=taken.record.reservation,
        fencing_token=taken.record.fencing_token,
    )
    done = await store.settle_local(
        op, owner, opening(owner, taken.record)[0], tenant="acme", route=ROUTE
    )
    assert done.record.state is OperationState.COMPLETED
    # the stale attempt finds the row not its own under the lock: its report is settled
    # (and ignored), its effect never runs, and the row stays the owner's
    late = await store.settle_local(
        op, stale, opening(stale, stale_row)[0], tenant="acme", route=ROUTE
    )
    assert late.decision.disposition.value == "ignored"
    assert await count(engine, accounts, accounts.c.operation_id == op) == 1
    current = await store.reads.get(op)
    assert current is not None and current.state is OperationState.COMPLETED
    assert late.record == current
    # in the same locked transaction: the probe recorded with its decision, the row's
    # revision unmoved, and the stale attempt ended with the reason
    (probe,) = await rows(engine, observations, observations.c.id == late.observation_id)
    assert (probe["kind"], probe["disposition"], probe["attempt_id"]) == (
        "unknown",
        "ignored",
        stale.attempt_id,
    )
    assert probe["revision_before"] == probe["revision_after"] == current.revision
    (ended,) = await rows(engine, attempts, attempts.c.id == stale.attempt_id)
    assert ended["finished_at"] is not None
    assert (ended["outcome"], ended["error"]) == ("unknown", late.decision.reason.value)


# -- the transfer (ledger.transfer_values) -----------------------------------------------


async def two_accounts(engine: AsyncEngine, source: int, destination: int = 0) -> list[uuid.UUID]:
    ids = [uuid.uuid4(), uuid.uuid4()]
    async with engine.begin() as conn:
        for account_id, balance in zip(ids, (source, destination), strict=True):
            await conn.execute(
                accounts.insert().values(
                    id=account_id, tenant="acme", currency="EUR", balance=balance
                )
            )
    return ids


async def balances(engine: AsyncEngine, ids: list[uuid.UUID]) -> list[int]:
    found = {
        row["id"]: row["balance"] for row in await rows(engine, accounts, accounts.c.id.in_(ids))
    }
    return [found[i] for i in ids]


def moving(
    attempt: AttemptRef,
    record: Record,
    ids: list[uuid.UUID],
    amount: int,
    said: list[tuple[str, str]] | None = None,
) -> EffectStatement:
    """A transfer as the server runs it (``ledger.transfer_values``); its guard's
    refusals are kept in ``said``."""
    op = uuid.UUID(attempt.reservation.operation_id)
    request = ledger.TransferRequest(
        source=ids[0], destination=ids[1], amount=amount, currency="EUR"
    )
    params, _ = ledger.transfer_values("acme", op, attempt.reservation.binding_generation, request)
    observation = completed(record, fencing_token=attempt.fencing_token)
    return EffectStatement(
        ledger.TRANSFER, params, observation, refusals(record, [] if said is None else said)
    )


async def test_a_transfer_and_its_settlement_are_one_statement_under_the_row_lock(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)
    ids = await two_accounts(engine, 100)
    said: list[tuple[str, str]] = []
    settled = await store.settle_local(
        op, attempt, moving(attempt, record, ids, 10, said), tenant="acme", route=ROUTE
    )
    assert said == []
    assert settled.record.state is OperationState.COMPLETED and settled.record.revision == 2
    assert await balances(engine, ids) == [90, 10]
    (moved,) = await rows(engine, transfers, transfers.c.operation_id == op)
    assert (moved["amount"], moved["source_id"], moved["binding_generation"]) == (10, ids[0], 1)
    (observed,) = await rows(engine, observations, observations.c.operation_id == op)
    assert (observed["disposition"], observed["revision_after"]) == ("applied", 2)
    (attempt_row,) = await rows(engine, attempts, attempts.c.operation_id == op)
    assert (attempt_row["outcome"], attempt_row["finished_at"] is not None) == ("completed", True)
    current = await store.reads.get(op)
    assert current is not None and current.state is OperationState.COMPLETED
    assert current.result is not None and current.result.digest == "d1"


# (balances, amount, the account in USD, the account missing, the refusal): in the guard's
# order, the first rule broken is the one named; {0} and {1}: the source and destination ids
REFUSALS = {
    "source-not-found": (
        100,
        0,
        10,
        None,
        0,
        ("account-not-found", "source account {0} not found"),
    ),
    "both-not-found": (100, 0, 10, None, 2, ("account-not-found", "source account {0} not found")),
    "destination-not-found": (
        100,
        0,
        10,
        None,
        1,
        ("account-not-found", "destination account {1} not found"),
    ),
    "source-currency": (
        100,
        0,
        10,
        0,
        None,
        ("currency-mismatch", "source account holds USD, the transfer is in EUR"),
    ),
    "destination-currency": (
        5,
        0,
        10,
        1,
        None,
        ("currency-mismatch", "destination account holds USD, the transfer is in EUR"),
    ),
    "insufficient-funds": (
        5,
        10**15,
        10,
        None,
        None,
        ("insufficient-funds", "source balance 5 is below the amount 10"),
    ),
    "balance-limit": (
        100,
        10**15,
        1,
        None,
        None,
        ("balance-limit", "the destination balance would exceed the limit"),
    ),
}


@pytest.mark.parametrize(
    ("source", "destination", "amount", "in_usd", "missing", "refusal"),
    list(REFUSALS.values()),
    ids=list(REFUSALS),
)
async def test_a_transfer_the_guard_refuses_is_settled_failed_with_its_reason_moving_nothing(
    engine: AsyncEngine,
    store: SettlementStore,
    clock: Clock,
    scope: Scope,
    source: int,
    destination: int,
    amount: int,
    in_usd: int | None,
    missing: int | None,
    refusal: tuple[str, str],
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)
    ids = await two_accounts(engine, source, destination)
    if in_usd is not None:
        async with engine.begin() as conn:
            await conn.execute(
                update(accounts).where(accounts.c.id == ids[in_usd]).values(currency="USD")
            )
    target = list(ids)
    for index in (0, 1) if missing == 2 else () if missing is None else (missing,):
        target[index] = uuid.uuid4()
    said: list[tuple[str, str]] = []
    settled = await store.settle_local(
        op, attempt, moving(attempt, record, target, amount, said), tenant="acme", route=ROUTE
    )
    assert said == [(refusal[0], refusal[1].format(*target))]
    assert settled.record.state is OperationState.FAILED
    assert await balances(engine, ids) == [source, destination]
    assert await count(engine, transfers, transfers.c.operation_id == op) == 0
    (attempt_row,) = await rows(engine, attempts, attempts.c.operation_id == op)
    assert attempt_row["outcome"] == "failed"
    (observed,) = await rows(engine, observations, observations.c.operation_id == op)
    assert (observed["kind"], observed["disposition"]) == ("failed", "applied")


async def test_a_demoted_row_is_settled_under_its_lock_and_the_transfer_made_once(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)
    clock.advance(60)
    demotion = CoreObservation(
        reservation=attempt.reservation, kind=ObservationKind.UNKNOWN, source=Source.SWEEPER
    )
    assert (await store.settle(op, demotion)).record.state is OperationState.UNKNOWN
    ids = await two_accounts(engine, 100)
    settled = await store.settle_local(
        op, attempt, moving(attempt, record, ids, 10), tenant="acme", route=ROUTE
    )
    assert settled.record.state is OperationState.COMPLETED and settled.record.revision == 3
    assert await balances(engine, ids) == [90, 10]
    assert await count(engine, transfers, transfers.c.operation_id == op) == 1


async def test_a_superseded_attempt_statement_moves_no_money(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)

    async def nobody_holds(scopes: list[Scope]) -> list[float | None]:
        return [None for _ in scopes]

    admin = await make_principal(engine)
    superseded = await store.supersede(
        op,
        reason="test",
        admin_id=admin,
        request_fingerprint=None,
        rebind=False,
        force=True,
        lease_remaining=nobody_holds,
    )
    assert isinstance(superseded, Supersede)
    ids = await two_accounts(engine, 100)
    settled = await store.settle_local(
        op, attempt, moving(attempt, record, ids, 10), tenant="acme", route=ROUTE
    )
    assert settled.decision.disposition.value in ("ignored", "quarantined")
    assert await balances(engine, ids) == [100, 0]
    assert await count(engine, transfers, transfers.c.operation_id == op) == 0


async def test_concurrent_statements_over_one_pair_both_ways_neither_deadlock_nor_lose_money(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, principal_id: uuid.UUID
) -> None:
    ids = await two_accounts(engine, 1000, 1000)
    plans = []
    for i in range(24):
        attempt, record = await claimed(store, make_scope(principal_id), clock)
        pair = ids if i % 2 == 0 else ids[::-1]
        plans.append((attempt, moving(attempt, record, pair, 1 + i % 3)))

    async def settle_one(attempt: AttemptRef, statement: EffectStatement) -> Any:
        op = uuid.UUID(attempt.reservation.operation_id)
        return await store.settle_local(op, attempt, statement, tenant="acme", route=ROUTE)

    done = await asyncio.gather(*(settle_one(*plan) for plan in plans))
    assert all(s.record.state is OperationState.COMPLETED for s in done)
    there = sum(1 + i % 3 for i in range(0, 24, 2))
    back = sum(1 + i % 3 for i in range(1, 24, 2))
    assert await balances(engine, ids) == [1000 - there + back, 1000 + there - back]
    assert await count(engine, transfers, transfers.c.source_id.in_(ids)) == 24


async def test_an_account_is_opened_once_per_epoch(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, scope: Scope
) -> None:
    attempt, record = await claimed(store, scope, clock)
    op = uuid.UUID(attempt.reservation.operation_id)
    statement, account = opening(attempt, record)
    settled = await store.settle_local(op, attempt, statement, tenant="acme", route=ROUTE)
    assert settled.record.state is OperationState.COMPLETED
    (opened,) = await rows(engine, accounts, accounts.c.operation_id == op)
    assert (opened["id"], opened["balance"], opened["binding_generation"]) == (account.id, 7, 1)
    # the same statement again (a stale duplicate of this attempt): nothing more is written
    again = await store.settle_local(op, attempt, statement, tenant="acme", route=ROUTE)
    assert again.decision.disposition.value == "ignored"
    assert await count(engine, accounts, accounts.c.operation_id == op) == 1


# -- a new operation claimed, run and settled in one statement ----------------------------


def new_transfer(
    ids: list[uuid.UUID], amount: int, said: list[tuple[str, str]] | None = None
) -> Any:
    """``build`` for ``claim_and_settle_local``: the transfer's statement for the claim."""

    def build(claimed_outcome: Any) -> EffectStatement:
        record = claimed_outcome.record
        op = uuid.UUID(record.reservation.operation_id)
        request = ledger.TransferRequest(
            source=ids[0], destination=ids[1], amount=amount, currency="EUR"
        )
        params, _ = ledger.transfer_values("acme", op, 1, request)
        refused = refusals(record, [] if said is None else said)
        return EffectStatement(ledger.TRANSFER, params, completed(record, fencing_token=1), refused)

    return build


@pytest.fixture(params=["statement", "function"])
async def one_statement(
    request: pytest.FixtureRequest, engine: AsyncEngine, clock: Clock, pool: Any
) -> SettlementStore:
    """The store, its one statement sent as is, or as a call of the effect's function
    (``SETTLEMENT_DB_CLAIM_SETTLE``; service.store.hot_functions)."""
    store = SettlementStore(engine, clock=clock, pool=pool, functions=request.param == "function")
    await store.install_functions([ledger.TRANSFER])
    return store


async def test_a_new_transfer_is_claimed_run_and_settled_in_one_statement(
    engine: AsyncEngine, one_statement: SettlementStore, clock: Clock, scope: Scope
) -> None:
    store = one_statement
    ids = await two_accounts(engine, 100)
    request = claim_request(scope.principal_id, clock)
    done = await store.claim_and_settle_local(
        scope, request, new_transfer(ids, 10), lease_token="t", route=ROUTE
    )
    assert done is not None
    claimed_outcome, settled = done
    op = uuid.UUID(request.new_operation_id)
    assert claimed_outcome.record is not None
    assert claimed_outcome.record.reservation.operation_id == request.new_operation_id
    assert settled.record.state is OperationState.COMPLETED and settled.record.revision == 2
    # the row as the two-phase way leaves it: revision 2, the attempt begun and ended, the
    # observation from revision 1 to 2
    current = await store.reads.get_by_scope(scope)
    assert current is not None and current.state is OperationState.COMPLETED
    assert current.revision == 2 and current.fencing_token == 1
    (attempt_row,) = await rows(engine, attempts, attempts.c.operation_id == op)
    assert (attempt_row["fencing_token"], attempt_row["outcome"]) == (1, "completed")
    assert attempt_row["lease_token"] == "t" and attempt_row["finished_at"] is not None
    (observed,) = await rows(engine, observations, observations.c.operation_id == op)
    assert (observed["revision_before"], observed["revision_after"]) == (1, 2)
    assert observed["attempt_id"] == attempt_row["id"] == claimed_outcome.attempt_id
    (row,) = await rows(engine, operations, operations.c.id == op)
    assert row["expires_at"] is not None and row["current_attempt_id"] == attempt_row["id"]
    assert await balances(engine, ids) == [90, 10]
    assert await count(engine, transfers, transfers.c.operation_id == op) == 1
    # a replay now reads the settled row
    found = await store.reads.identify(
        key_hash(scope.principal_id), scope.route, scope.idempotency_key
    )
    assert found is not None and found[1] == current


async def test_a_new_transfer_the_guard_refuses_is_settled_failed_in_one_more_statement(
    engine: AsyncEngine, one_statement: SettlementStore, clock: Clock, scope: Scope
) -> None:
    store = one_statement
    ids = await two_accounts(engine, 5)
    request = claim_request(scope.principal_id, clock)
    said: list[tuple[str, str]] = []
    done = await store.claim_and_settle_local(
        scope, request, new_transfer(ids, 10, said), lease_token="t", route=ROUTE
    )
    assert done is not None
    assert said == [("insufficient-funds", "source balance 5 is below the amount 10")]
    _, settled = done
    assert settled.record.state is OperationState.FAILED and settled.record.revision == 2
    current = await store.reads.get_by_scope(scope)
    assert current is not None and current.state is OperationState.FAILED
    op = uuid.UUID(request.new_operation_id)
    (attempt_row,) = await rows(engine, attempts, attempts.c.operation_id == op)
    assert attempt_row["outcome"] == "failed"
    (observed,) = await rows(engine, observations, observations.c.operation_id == op)
    assert (observed["kind"], observed["disposition"]) == ("failed", "applied")
    assert await balances(engine, ids) == [5, 0]
    assert await count(engine, transfers, transfers.c.source_id == ids[0]) == 0


async def test_a_new_transfer_under_a_taken_scope_writes_nothing(
    engine: AsyncEngine, one_statement: SettlementStore, clock: Clock, scope: Scope
) -> None:
    """Another claimer's row exists (it inserted after this request read none): the one
    statement's insert does nothing, so neither does the transfer."""
    store = one_statement
    _, first = await claimed(store, scope, clock)
    ids = await two_accounts(engine, 100)
    done = await store.claim_and_settle_local(
        scope,
        claim_request(scope.principal_id, clock),
        new_transfer(ids, 10),
        lease_token="u",
        route=ROUTE,
    )
    assert done is None
    assert await balances(engine, ids) == [100, 0]
    current = await store.reads.get_by_scope(scope)
    assert current is not None and current == first


async def test_two_new_statements_of_one_scope_at_once_run_the_transfer_once(
    engine: AsyncEngine, one_statement: SettlementStore, clock: Clock, scope: Scope
) -> None:
    """Were the lease to run out while the statement runs, a second request would send its
    own: the scope's unique row decides, not the lease. One writes; the other writes
    nothing and answers from the row under its lock."""
    store = one_statement
    ids = await two_accounts(engine, 100)
    requests = [claim_request(scope.principal_id, clock) for _ in range(6)]
    done = await asyncio.gather(
        *(
            store.claim_and_settle_local(
                scope, request, new_transfer(ids, 10), lease_token=str(i), route=ROUTE
            )
            for i, request in enumerate(requests)
        )
    )
    assert sum(d is not None for d in done) == 1
    assert await balances(engine, ids) == [90, 10]
    assert await count(engine, transfers, transfers.c.source_id == ids[0]) == 1
    assert (
        await count(engine, operations, operations.c.idempotency_key == scope.idempotency_key) == 1
    )


async def test_every_connection_plans_once_in_utc_with_one_lock_timeout(pool: Any) -> None:
    """Generic plans from the first execution, UTC, and the one (short) lock timeout: the
    settings of every connection of the pool, hot or cold."""
    async with pool.acquire() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_generic_plan"
        assert await conn.fetchval("SHOW lock_timeout") == "1s"
        assert await conn.fetchval("SHOW timezone") == "UTC"
    async with pool.engine.connect() as cold:
        assert await cold.scalar(text("SHOW plan_cache_mode")) == "force_generic_plan"
        assert await cold.scalar(text("SHOW lock_timeout")) == "1s"


async def test_an_acquire_beyond_the_pool_size_waits_only_the_acquire_timeout(
    migrated_url: str,
) -> None:
    """The acquire beyond the pool's size waits the connect timeout, then PoolTimeout; the
    connections given back are the pool's again."""
    settings = Settings.from_env({}, db_connect_timeout=0.5)
    pool = await make_pool(settings, migrated_url, size=2)
    hold = asyncio.Event()
    holding: list[int] = []

    async def borrow() -> None:
        async with pool.acquire() as conn:
            holding.append(await conn.fetchval("SELECT 1"))
            await hold.wait()

    try:
        tasks = [asyncio.create_task(borrow()) for _ in range(3)]
        done, _ = await asyncio.wait(tasks, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        with pytest.raises(PoolTimeout):
            await done.pop()
        for _ in range(100):  # the second connection may still be opening on a busy machine
            if len(holding) == 2:
                break
            await asyncio.sleep(0.05)
        assert holding == [1, 1]
        hold.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0)
        assert pool.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 2") == 2
    finally:
        hold.set()
        await pool.close()


async def test_a_connection_given_back_in_a_transaction_or_mid_statement_is_not_reused(
    migrated_url: str,
) -> None:
    """A borrow that ends with a transaction still open (begun on asyncpg, which SQLAlchemy's
    reset on return does not see) or with its statement cancelled does not hand that
    connection to the next user: it is closed, and the pool opens a new one."""
    pool = await make_pool(Settings.from_env({}), migrated_url, size=1)
    try:
        async with pool.acquire() as conn:
            first = await conn.fetchval("SELECT pg_backend_pid()")
            await conn.execute("BEGIN")
            await conn.execute("CREATE TEMP TABLE left_open (x int)")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            second = await conn.fetchval("SELECT pg_backend_pid()")
            assert await conn.fetchval("SELECT to_regclass('pg_temp.left_open')") is None
        assert second != first

        borrowed: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def sleeper() -> None:
            async with pool.acquire() as conn:
                borrowed.set_result(await conn.fetchval("SELECT pg_backend_pid()"))
                await conn.execute("SELECT pg_sleep(5)")

        task = asyncio.create_task(sleeper())
        watcher = await asyncpg.connect(plain_dsn(migrated_url))
        try:  # cancelled only once its statement runs on the server
            running = "SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'"
            pid = await borrowed
            async with asyncio.timeout(10):
                while True:  # polled: the server's state, no event of ours
                    if await watcher.fetchval(running, pid) == "SELECT pg_sleep(5)":
                        break
                    await asyncio.sleep(0.01)
        finally:
            await watcher.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 3") == 3
            assert await conn.fetchval("SELECT pg_backend_pid()") != second

        with pytest.raises(ValueError):  # an ordinary error between statements: kept
            async with pool.acquire() as conn:
                third = await conn.fetchval("SELECT pg_backend_pid()")
                raise ValueError("not the connection's fault")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT pg_backend_pid()") == third
    finally:
        await pool.close()


async def test_a_conflict_is_one_shape_on_both_write_paths(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, pool: Any
) -> None:
    """The row's ``conflict`` (jsonb) as record_values gives it: written through
    SQLAlchemy, and through a hot statement (JSON text, the engine's codec), read back the
    same through the hot path's connections."""
    record, operation_id = await new_operation(engine, store, clock)
    conflict = ConflictInfo(
        digests=("d1", "d2"), kinds=(ObservationKind.COMPLETED, ObservationKind.FAILED)
    )
    written = replace(record, state=OperationState.CONFLICT, conflict=conflict)
    async with engine.begin() as conn:
        await conn.execute(
            update(operations)
            .where(operations.c.id == operation_id)
            .values(conflict=record_values(written)["conflict"])
        )
    async with pool.acquire() as conn:
        row = await conn.fetchrow(LOCK.sql, *LOCK.args({"id": operation_id, "tenant": "acme"}))
    assert record_from_row(row).conflict == conflict
    statement = Prepared(
        update(operations)
        .where(operations.c.id == bindparam("id", type_=operations.c.id.type))
        .values(conflict=bindparam("conflict", type_=operations.c.conflict.type))
    )
    again = ConflictInfo(digests=("d3",), kinds=(ObservationKind.FAILED,))
    shape = record_values(replace(written, conflict=again))["conflict"]
    values = {"id": operation_id, "conflict": shape}
    async with pool.acquire() as conn:
        await conn.execute(statement.sql, *statement.args(values))
    async with engine.connect() as conn:
        stored = await conn.scalar(
            select(operations.c.conflict).where(operations.c.id == operation_id)
        )
    assert stored == {"digests": ["d3"], "kinds": ["failed"]}
    async with pool.acquire() as conn:
        row = await conn.fetchrow(LOCK.sql, *LOCK.args({"id": operation_id, "tenant": "acme"}))
    assert record_from_row(row).conflict == again
