"""The settlement store against real PostgreSQL: locked, CAS-guarded, observation-recording."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import msgspec
import pytest
from sqlalchemy import bindparam, exists, insert, literal_column, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.selectable import CTE

from service.core import (
    Apply,
    Claim,
    ClaimKind,
    Decision,
    InProgress,
    Observation,
    OperationState,
    Record,
    Replay,
)
from service.store.outcomes import EffectSql, never_refused
from service.store.retention import Retention
from service.store.rows import at, record_from_row
from service.store.settlement import (
    AttemptRef,
    EffectRefused,
    EffectStatement,
    OperationNotFound,
    SettlementStore,
)
from service.store.tables import (
    accounts,
    attempts,
    observations,
    operations,
    transfers,
)
from service.store.unit_of_work import StaleRevision, UnitOfWork
from tests.integration.factories import (
    LEASE,
    Clock,
    Scope,
    claim_request,
    completed,
    count,
    new_operation,
    rows,
)
from tests.unit.factories import make_observation

pytestmark = pytest.mark.integration

# the route whose retention a settled row starts (the default one here)
ROUTE = "POST /v1/accounts"


async def test_new_claim_writes_operation_and_attempt_with_first_fencing_token(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> None:
    record, operation_id = await new_operation(engine, store, clock)
    stored = await store.reads.get(operation_id)
    assert stored == record
    assert stored.state is OperationState.IN_PROGRESS
    assert (stored.revision, stored.fencing_token) == (1, 1)
    assert await count(engine, attempts, attempts.c.operation_id == operation_id) == 1


async def test_concurrent_claims_on_one_new_scope_have_exactly_one_winner(
    engine: AsyncEngine, clock: Clock, principal_id: uuid.UUID, scope: Scope
) -> None:
    stores = [SettlementStore(engine, clock=clock) for _ in range(5)]
    outcomes = await asyncio.gather(
        *(s.claim(scope, claim_request(principal_id, clock)) for s in stores)
    )
    kinds = [type(o.decision) for o in outcomes]
    assert kinds.count(Claim) == 1
    assert kinds.count(InProgress) == 4
    assert await count(engine, operations, operations.c.principal_id == principal_id) == 1


async def test_retry_after_lease_expiry_demotes_stale_in_progress_and_claims(
    engine: AsyncEngine,
    store: SettlementStore,
    clock: Clock,
    principal_id: uuid.UUID,
    scope: Scope,
) -> None:
    first = await store.claim(scope, claim_request(principal_id, clock))
    assert isinstance(first.decision, Claim)

    blocked = await store.claim(scope, claim_request(principal_id, clock))
    assert isinstance(blocked.decision, InProgress)

    clock.advance(LEASE + 1)
    second = await store.claim(scope, claim_request(principal_id, clock))
    assert isinstance(second.decision, Claim)
    assert second.decision.kind is ClaimKind.DEMOTE_STALE
    assert second.record is not None
    assert second.record.fencing_token == 2
    operation_id = uuid.UUID(second.record.reservation.operation_id)
    assert await count(engine, attempts, attempts.c.operation_id == operation_id) == 2
    recorded = await rows(engine, observations, observations.c.operation_id == operation_id)
    assert [(r["source"], r["kind"], r["stage"], r["disposition"]) for r in recorded] == [
        ("claim", "unknown", "B", "applied")
    ]
    # the audit row tells the truth: one write r -> r + 1 that left the row in_progress under
    # the new token (no "unknown" revision ever existed), made by the new attempt's claim
    (demotion,) = recorded
    assert (demotion["revision_before"], demotion["revision_after"]) == (1, 2)
    assert demotion["attempt_id"] == second.attempt_id
    assert demotion["detail"] == {
        "written_with_claim": True,
        "state_after": "in_progress",
        "fencing_token_after": 2,
    }


async def test_stale_fencing_token_cannot_settle_after_takeover(
    store: SettlementStore, clock: Clock, principal_id: uuid.UUID, scope: Scope
) -> None:
    first = await store.claim(scope, claim_request(principal_id, clock))
    assert first.record is not None
    clock.advance(LEASE + 1)
    await store.claim(scope, claim_request(principal_id, clock))
    operation_id = uuid.UUID(first.record.reservation.operation_id)

    late = await store.settle(operation_id, completed(first.record, fencing_token=1))
    assert late.decision.disposition.value == "ignored"
    stored = await store.reads.get(operation_id)
    assert stored is not None and stored.state is OperationState.IN_PROGRESS


async def test_completed_then_retry_replays(
    engine: AsyncEngine, clock: Clock, principal_id: uuid.UUID, scope: Scope
) -> None:
    store = SettlementStore(engine, clock=clock, retention=Retention(default=3600, tombstone=7200))
    first = await store.claim(scope, claim_request(principal_id, clock))
    assert first.record is not None
    operation_id = uuid.UUID(first.record.reservation.operation_id)
    settled = await store.settle(operation_id, completed(first.record, fencing_token=1))
    assert isinstance(settled.decision, Apply)
    assert settled.record.state is OperationState.COMPLETED

    again = await store.claim(scope, claim_request(principal_id, clock))
    assert isinstance(again.decision, Replay)
    assert again.decision.result.digest == "d1"
    (row,) = await rows(engine, operations, operations.c.id == operation_id)
    assert row["expires_at"].timestamp() == pytest.approx(clock.now + 3600)


async def test_two_concurrent_settlers_lose_no_update(
    engine: AsyncEngine,
    store: SettlementStore,
    clock: Clock,
    open_engine: Callable[[], AsyncEngine],
) -> None:
    """Two settlers on separate connection pools hammer one row: every Apply is a distinct
    revision, the revisions are gapless, and every observation is recorded."""
    rounds = 40
    record, operation_id = await new_operation(engine, store, clock)

    def observations_for(settler: int) -> list[Observation]:
        """Alternating reports of this attempt: alive (a later lease each time) and unknown."""
        return [
            make_observation(
                "in_progress",
                reservation=record.reservation,
                fencing_token=1,
                lease=clock.now + LEASE + i + settler / 10,
            )
            if (i + settler) % 2
            else make_observation("unknown", reservation=record.reservation, fencing_token=1)
            for i in range(rounds)
        ]

    async def settler(n: int) -> list[Decision]:
        own = SettlementStore(open_engine(), clock=clock)
        return [(await own.settle(operation_id, obs)).decision for obs in observations_for(n)]

    results = await asyncio.gather(settler(0), settler(1))
    applied = sum(isinstance(d, Apply) for ds in results for d in ds)
    assert applied > 0

    final = await store.reads.get(operation_id)
    assert final is not None
    assert final.revision == record.revision + applied
    applied_rows = await rows(
        engine,
        observations,
        observations.c.operation_id == operation_id,
        observations.c.disposition == "applied",
        order_by=observations.c.id,
    )
    assert (
        await count(engine, observations, observations.c.operation_id == operation_id) == 2 * rounds
    )
    afters = [r["revision_after"] for r in applied_rows]
    assert afters == list(range(record.revision + 1, final.revision + 1))
    assert all(r["revision_after"] == r["revision_before"] + 1 for r in applied_rows)


async def test_write_with_stale_revision_is_refused(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> None:
    record, operation_id = await new_operation(engine, store, clock)
    await store.settle(operation_id, completed(record, fencing_token=1))
    current = await store.reads.get(operation_id)
    assert current is not None and current.revision == 2

    async with store.unit_of_work() as uow:
        with pytest.raises(StaleRevision):
            await uow.cas_write(
                msgspec.structs.replace(record, state=OperationState.UNKNOWN),
                record.revision,
                at(clock.now),
            )
    assert await store.reads.get(operation_id) == current


async def test_cas_refusal_reloads_and_reruns_all_stages(engine: AsyncEngine, clock: Clock) -> None:
    """A writer that moved the revision between our read and our write forces a rerun on the
    reloaded row: here the row became terminal meanwhile, so the rerun ignores the report."""

    class RacingUnitOfWork(UnitOfWork):
        raced = False

        async def get_for_update_with_scope(
            self, operation_id: uuid.UUID
        ) -> tuple[Scope, Record] | None:
            if RacingUnitOfWork.raced:
                return await super().get_for_update_with_scope(operation_id)
            RacingUnitOfWork.raced = True
            # Hand back the row as it was before another writer committed revision 2.
            (row,) = await rows(engine, operations, operations.c.id == operation_id)
            async with engine.begin() as writer:
                await _write_behind(writer, operation_id)
            locked = await super().get_for_update_with_scope(operation_id)
            assert locked is not None
            return locked[0], record_from_row(row)

    class RacingStore(SettlementStore):
        def unit_of_work(self) -> UnitOfWork:
            return RacingUnitOfWork(engine)

    store = RacingStore(engine, clock=clock)
    record, operation_id = await new_operation(engine, store, clock)
    unknown = make_observation("unknown", reservation=record.reservation, fencing_token=1)
    settled = await store.settle(operation_id, unknown)
    # First round decided "apply unknown" on revision 1, but the row had moved to a
    # completed revision 2; the rerun sees completed and ignores the late unknown.
    assert settled.decision.disposition.value == "ignored"
    final = await store.reads.get(operation_id)
    assert final is not None
    assert final.state is OperationState.COMPLETED and final.revision == 2
    assert await count(engine, observations, observations.c.operation_id == operation_id) == 1


async def test_observation_about_unknown_operation_is_recorded_and_refused(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> None:
    record, _ = await new_operation(engine, store, clock)
    missing = uuid.uuid4()
    with pytest.raises(OperationNotFound):
        await store.settle(missing, completed(record))
    (row,) = await rows(engine, observations, observations.c.operation_id == missing)
    assert (row["disposition"], row["reason"]) == ("quarantined", "unknown-operation")


def _one_account(written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
    opened = (
        insert(accounts)
        .from_select(
            ["id", "tenant", "currency", "balance"],
            select(
                bindparam("e_id", type_=accounts.c.id.type),
                literal_column("'acme'"),
                literal_column("'EUR'"),
                bindparam("e_balance", type_=accounts.c.balance.type),
            ).where(exists(select(written.c.id))),
        )
        .cte("opened")
    )
    return (opened,)


ONE_ACCOUNT = EffectSql("one-account", guard=never_refused, apply=_one_account)


def writes_account(record: Record, account_id: uuid.UUID, balance: int) -> EffectStatement:
    """A local effect as SQL: one account row (a negative balance breaks its CHECK)."""

    def refused(slug: str, detail: str) -> Observation:
        raise AssertionError(f"the guard never refuses ({slug}: {detail})")

    return EffectStatement(
        ONE_ACCOUNT,
        {"e_id": account_id, "e_balance": balance},
        completed(record, fencing_token=1),
        refused,
    )


async def test_local_effect_commits_with_the_settlement_or_not_at_all(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> None:
    record, operation_id = await new_operation(engine, store, clock)
    attempt = AttemptRef(attempt_id=uuid.uuid4(), reservation=record.reservation, fencing_token=1)
    account_id = uuid.uuid4()

    # the database refuses the effect's write: nothing of the settlement commits either
    with pytest.raises(EffectRefused) as refused_by_check:
        await store.settle_local(
            operation_id,
            attempt,
            writes_account(record, account_id, -1),
            tenant="acme",
            route=ROUTE,
        )
    assert refused_by_check.value.constraint == "ck_accounts_balance_non_negative"
    assert await count(engine, accounts, accounts.c.id == account_id) == 0
    unchanged = await store.reads.get(operation_id)
    assert unchanged is not None and unchanged.state is OperationState.IN_PROGRESS
    assert await count(engine, observations, observations.c.operation_id == operation_id) == 0

    stale = AttemptRef(attempt_id=uuid.uuid4(), reservation=record.reservation, fencing_token=7)
    effect = writes_account(record, account_id, 5)
    refused = await store.settle_local(operation_id, stale, effect, tenant="acme", route=ROUTE)
    assert refused.decision.disposition.value == "ignored"
    assert await count(engine, accounts, accounts.c.id == account_id) == 0

    done = await store.settle_local(operation_id, attempt, effect, tenant="acme", route=ROUTE)
    assert done.record.state is OperationState.COMPLETED
    assert await count(engine, accounts, accounts.c.id == account_id) == 1

    # A second run of the same attempt finds the row terminal: nothing is written twice.
    again = await store.settle_local(operation_id, attempt, effect, tenant="acme", route=ROUTE)
    assert again.decision.disposition.value == "ignored"
    assert await count(engine, accounts, accounts.c.id == account_id) == 1


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE operations SET state = 'done' WHERE id = :op",
        "UPDATE operations SET state = 'completed' WHERE id = :op",
        "UPDATE operations SET state = 'conflict' WHERE id = :op",
        "UPDATE operations SET revision = 0 WHERE id = :op",
        "INSERT INTO accounts (id, tenant, currency, balance) "
        "VALUES (gen_random_uuid(), 'acme', 'EUR', -1)",
        "INSERT INTO accounts (id, tenant, currency, balance) "
        "VALUES (gen_random_uuid(), 'acme', 'eur', 1)",
        "INSERT INTO operations SELECT * FROM operations WHERE id = :op",
    ],
    ids=[
        "unknown-state",
        "terminal-without-result",
        "conflict-without-record",
        "revision-zero",
        "negative-balance",
        "lowercase-currency",
        "duplicate-scope",
    ],
)
async def test_schema_constraints_refuse_invalid_rows(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, statement: str
) -> None:
    _, operation_id = await new_operation(engine, store, clock)
    async with engine.begin() as conn:
        with pytest.raises(IntegrityError):
            await conn.execute(text(statement), {"op": operation_id})


async def test_one_transfer_per_operation(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> None:
    _, operation_id = await new_operation(engine, store, clock)
    a, b = uuid.uuid4(), uuid.uuid4()
    async with engine.begin() as conn:
        for account in (a, b):
            await conn.execute(
                insert(accounts).values(id=account, tenant="acme", currency="EUR", balance=100)
            )

    def transfer() -> object:
        return insert(transfers).values(
            id=uuid.uuid4(),
            tenant="acme",
            operation_id=operation_id,
            source_id=a,
            destination_id=b,
            amount=1,
            currency="EUR",
        )

    async with engine.begin() as conn:
        await conn.execute(transfer())  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        async with engine.begin() as conn:
            await conn.execute(transfer())  # type: ignore[arg-type]


async def _write_behind(conn: AsyncConnection, operation_id: uuid.UUID) -> None:
    """Move the row to completed/revision 2, as another writer would."""
    await conn.execute(
        update(operations)
        .where(operations.c.id == operation_id)
        .values(
            state="completed",
            revision=2,
            result_status=201,
            result_content_type="application/json",
            result_body=b"{}",
            result_digest="d0",
        )
    )
