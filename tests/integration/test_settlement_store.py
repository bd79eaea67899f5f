"""The settlement store against real PostgreSQL: locked, CAS-guarded, observation-recording."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from service.core import (
    Apply,
    Binding,
    Claim,
    ClaimKind,
    ClaimRequest,
    Decision,
    InProgress,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    Replay,
    Result,
    Scope,
    Source,
)
from service.store.db import async_url
from service.store.rows import at, record_from_row
from service.store.settlement import AttemptRef, OperationNotFound, SettlementStore
from service.store.tables import (
    accounts,
    attempts,
    observations,
    operations,
    principals,
    transfers,
)
from service.store.unit_of_work import StaleRevision, UnitOfWork
from tests.conftest import run

pytestmark = pytest.mark.integration

LEASE = 10.0


class Clock:
    """A settable clock: the store takes time as a parameter, like the core."""

    def __init__(self, now: float = 1_900_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def engine_for(url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(async_url(url), pool_size=5, max_overflow=0)
    try:
        yield engine
    finally:
        await engine.dispose()


async def make_principal(engine: AsyncEngine, tenant: str = "acme") -> uuid.UUID:
    principal_id = uuid.uuid4()
    async with engine.begin() as conn:
        await conn.execute(
            insert(principals).values(
                id=principal_id,
                tenant=tenant,
                name=f"p-{principal_id.hex[:8]}",
                role="client",
                key_hash=hashlib.sha256(principal_id.bytes).digest(),
            )
        )
    return principal_id


def make_scope(principal_id: uuid.UUID, key: str | None = None) -> Scope:
    return Scope(
        tenant="acme",
        principal_id=principal_id,
        route="POST /v1/transfers",
        idempotency_key=key or uuid.uuid4().hex,
    )


def make_request(
    principal_id: uuid.UUID, clock: Clock, fingerprint: str = "f" * 64
) -> ClaimRequest:
    return ClaimRequest(
        request_fingerprint=fingerprint,
        binding=Binding(principal_id=str(principal_id), credential_generation=1),
        new_operation_id=str(uuid.uuid4()),
        lease_expires_at=clock.now + LEASE,
    )


def completed(record: Record, digest: str = "d1", **kw: object) -> Observation:
    return Observation(
        tuple=record.tuple,
        kind=ObservationKind.COMPLETED,
        source=Source.ATTEMPT,
        result=Result(status=201, content_type="application/json", body=b"{}", digest=digest),
        **kw,  # type: ignore[arg-type]
    )


async def new_operation(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> tuple[Record, uuid.UUID]:
    principal_id = await make_principal(engine)
    outcome = await store.claim(make_scope(principal_id), make_request(principal_id, clock))
    assert isinstance(outcome.decision, Claim) and outcome.record is not None
    return outcome.record, uuid.UUID(outcome.record.tuple.operation_id)


def engine_of(store: SettlementStore) -> AsyncEngine:
    return store._engine  # the test reaches into the store to wrap its unit of work


async def count(engine: AsyncEngine, table: object, *where: object) -> int:
    async with engine.connect() as conn:
        stmt = select(func.count()).select_from(table).where(*where)  # type: ignore[arg-type]
        return int((await conn.execute(stmt)).scalar_one())


def test_new_claim_writes_operation_and_attempt_with_first_fencing_token(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            record, operation_id = await new_operation(engine, store, clock)
            stored = await store.get(operation_id)
            assert stored == record
            assert stored.state is OperationState.IN_PROGRESS
            assert (stored.revision, stored.fencing_token) == (1, 1)
            assert await count(engine, attempts, attempts.c.operation_id == operation_id) == 1

    run(scenario())


def test_concurrent_claims_on_one_new_scope_have_exactly_one_winner(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            principal_id = await make_principal(engine)
            scope = make_scope(principal_id)
            stores = [SettlementStore(engine, clock=clock) for _ in range(5)]
            outcomes = await asyncio.gather(
                *(s.claim(scope, make_request(principal_id, clock)) for s in stores)
            )
            kinds = [type(o.decision) for o in outcomes]
            assert kinds.count(Claim) == 1
            assert kinds.count(InProgress) == 4
            assert await count(engine, operations, operations.c.principal_id == principal_id) == 1

    run(scenario())


def test_retry_after_lease_expiry_demotes_stale_in_progress_and_claims(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            principal_id = await make_principal(engine)
            scope = make_scope(principal_id)
            first = await store.claim(scope, make_request(principal_id, clock))
            assert isinstance(first.decision, Claim)

            blocked = await store.claim(scope, make_request(principal_id, clock))
            assert isinstance(blocked.decision, InProgress)

            clock.now += LEASE + 1
            second = await store.claim(scope, make_request(principal_id, clock))
            assert isinstance(second.decision, Claim)
            assert second.decision.kind is ClaimKind.DEMOTE_STALE
            assert second.record is not None
            assert second.record.fencing_token == 2
            operation_id = uuid.UUID(second.record.tuple.operation_id)
            assert await count(engine, attempts, attempts.c.operation_id == operation_id) == 2
            async with engine.connect() as conn:
                rows = (
                    (
                        await conn.execute(
                            select(observations).where(observations.c.operation_id == operation_id)
                        )
                    )
                    .mappings()
                    .all()
                )
            assert [(r["source"], r["kind"], r["stage"], r["disposition"]) for r in rows] == [
                ("claim", "unknown", "B", "applied")
            ]

    run(scenario())


def test_stale_fencing_token_cannot_settle_after_takeover(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            principal_id = await make_principal(engine)
            scope = make_scope(principal_id)
            first = await store.claim(scope, make_request(principal_id, clock))
            assert first.record is not None
            clock.now += LEASE + 1
            await store.claim(scope, make_request(principal_id, clock))
            operation_id = uuid.UUID(first.record.tuple.operation_id)

            late = await store.settle(operation_id, completed(first.record, fencing_token=1))
            assert late.decision.disposition.value == "ignored"
            stored = await store.get(operation_id)
            assert stored is not None and stored.state is OperationState.IN_PROGRESS

    run(scenario())


def test_completed_then_retry_replays(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock, retention=3600)
            principal_id = await make_principal(engine)
            scope = make_scope(principal_id)
            first = await store.claim(scope, make_request(principal_id, clock))
            assert first.record is not None
            operation_id = uuid.UUID(first.record.tuple.operation_id)
            settled = await store.settle(operation_id, completed(first.record, fencing_token=1))
            assert isinstance(settled.decision, Apply)
            assert settled.record.state is OperationState.COMPLETED

            again = await store.claim(scope, make_request(principal_id, clock))
            assert isinstance(again.decision, Replay)
            assert again.decision.result.digest == "d1"
            async with engine.connect() as conn:
                expires_at = (
                    await conn.execute(
                        select(operations.c.expires_at).where(operations.c.id == operation_id)
                    )
                ).scalar_one()
            assert expires_at.timestamp() == pytest.approx(clock.now + 3600)

    run(scenario())


def test_two_concurrent_settlers_lose_no_update(migrated_url: str) -> None:
    """Two settlers on separate connections hammer one row: every Apply is a distinct
    revision, the revisions are gapless, and every observation is recorded."""
    rounds = 40

    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as setup:
            base_store = SettlementStore(setup, clock=clock)
            record, operation_id = await new_operation(setup, base_store, clock)

        def observations_for(settler: int) -> list[Observation]:
            out = []
            for i in range(rounds):
                if (i + settler) % 2:
                    out.append(
                        Observation(
                            tuple=record.tuple,
                            kind=ObservationKind.IN_PROGRESS,
                            source=Source.ATTEMPT,
                            fencing_token=1,
                            lease_expires_at=clock.now + LEASE + i + settler / 10,
                        )
                    )
                else:
                    out.append(
                        Observation(
                            tuple=record.tuple,
                            kind=ObservationKind.UNKNOWN,
                            source=Source.ATTEMPT,
                            fencing_token=1,
                        )
                    )
            return out

        async def settler(n: int) -> list[Decision]:
            async with engine_for(migrated_url) as engine:
                store = SettlementStore(engine, clock=clock)
                decisions = []
                for obs in observations_for(n):
                    decisions.append((await store.settle(operation_id, obs)).decision)
                return decisions

        results = await asyncio.gather(settler(0), settler(1))
        applied = sum(isinstance(d, Apply) for ds in results for d in ds)
        assert applied > 0

        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            final = await store.get(operation_id)
            assert final is not None
            assert final.revision == record.revision + applied
            async with engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(observations.c.revision_before, observations.c.revision_after)
                        .where(
                            observations.c.operation_id == operation_id,
                            observations.c.disposition == "applied",
                        )
                        .order_by(observations.c.id)
                    )
                ).all()
            assert (
                await count(engine, observations, observations.c.operation_id == operation_id)
                == 2 * rounds
            )
            afters = [r.revision_after for r in rows]
            assert afters == list(range(record.revision + 1, final.revision + 1))
            assert all(r.revision_after == r.revision_before + 1 for r in rows)

    run(scenario())


def test_write_with_stale_revision_is_refused(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            record, operation_id = await new_operation(engine, store, clock)
            await store.settle(operation_id, completed(record, fencing_token=1))
            current = await store.get(operation_id)
            assert current is not None and current.revision == 2

            async with store.unit_of_work() as uow:
                with pytest.raises(StaleRevision):
                    await uow.cas_write(
                        msgspec.structs.replace(record, state=OperationState.UNKNOWN),
                        record.revision,
                        at(clock.now),
                    )
            assert await store.get(operation_id) == current

    run(scenario())


def test_cas_refusal_reloads_and_reruns_all_stages(migrated_url: str) -> None:
    """A writer that moved the revision between our read and our write forces a rerun on the
    reloaded row: here the row became terminal meanwhile, so the rerun ignores the report."""

    class RacingUnitOfWork(UnitOfWork):
        raced = False

        async def get_for_update(self, operation_id: uuid.UUID) -> Record | None:
            if RacingUnitOfWork.raced:
                return await super().get_for_update(operation_id)
            RacingUnitOfWork.raced = True
            # Hand back the row as it was before another writer committed revision 2.
            engine = self.connection.engine
            async with engine.connect() as reader:
                row = (
                    (
                        await reader.execute(
                            select(operations).where(operations.c.id == operation_id)
                        )
                    )
                    .mappings()
                    .one()
                )
            async with engine.begin() as writer:
                await _write_behind(writer, operation_id)
            await super().get_for_update(operation_id)
            return record_from_row(row)

    class RacingStore(SettlementStore):
        def unit_of_work(self) -> UnitOfWork:
            return RacingUnitOfWork(engine_of(self))

    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = RacingStore(engine, clock=clock)
            record, operation_id = await new_operation(engine, store, clock)
            lease = Observation(
                tuple=record.tuple,
                kind=ObservationKind.UNKNOWN,
                source=Source.ATTEMPT,
                fencing_token=1,
            )
            settled = await store.settle(operation_id, lease)
            # First round decided "apply unknown" on revision 1, but the row had moved to a
            # completed revision 2; the rerun sees completed and ignores the late unknown.
            assert settled.decision.disposition.value == "ignored"
            final = await store.get(operation_id)
            assert final is not None
            assert final.state is OperationState.COMPLETED and final.revision == 2
            assert (
                await count(engine, observations, observations.c.operation_id == operation_id) == 1
            )

    run(scenario())


def test_observation_about_unknown_operation_is_recorded_and_refused(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            record, _ = await new_operation(engine, store, clock)
            missing = uuid.uuid4()
            with pytest.raises(OperationNotFound):
                await store.settle(missing, completed(record))
            async with engine.connect() as conn:
                row = (
                    (
                        await conn.execute(
                            select(observations).where(observations.c.operation_id == missing)
                        )
                    )
                    .mappings()
                    .one()
                )
            assert (row["disposition"], row["reason"]) == ("quarantined", "unknown-operation")

    run(scenario())


def test_local_effect_commits_with_the_settlement_or_not_at_all(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            record, operation_id = await new_operation(engine, store, clock)
            attempt = AttemptRef(attempt_id=uuid.uuid4(), reservation=record.tuple, fencing_token=1)
            account_id = uuid.uuid4()

            async def write_account(conn: AsyncConnection) -> None:
                await conn.execute(
                    insert(accounts).values(id=account_id, tenant="acme", currency="EUR", balance=5)
                )

            async def failing_effect(conn: AsyncConnection, current: Record) -> Observation:
                await write_account(conn)
                raise RuntimeError("effect failed after writing")

            with pytest.raises(RuntimeError):
                await store.settle_local(operation_id, attempt, failing_effect)
            assert await count(engine, accounts, accounts.c.id == account_id) == 0
            unchanged = await store.get(operation_id)
            assert unchanged is not None and unchanged.state is OperationState.IN_PROGRESS
            assert (
                await count(engine, observations, observations.c.operation_id == operation_id) == 0
            )

            stale = AttemptRef(attempt_id=uuid.uuid4(), reservation=record.tuple, fencing_token=7)

            async def effect(conn: AsyncConnection, current: Record) -> Observation:
                await write_account(conn)
                return completed(current, fencing_token=1)

            refused = await store.settle_local(operation_id, stale, effect)
            assert refused.decision.disposition.value == "ignored"
            assert await count(engine, accounts, accounts.c.id == account_id) == 0

            done = await store.settle_local(operation_id, attempt, effect)
            assert done.record.state is OperationState.COMPLETED
            assert await count(engine, accounts, accounts.c.id == account_id) == 1

            # A second run of the same attempt finds the row terminal: nothing is written twice.
            again = await store.settle_local(operation_id, attempt, effect)
            assert again.decision.disposition.value == "ignored"
            assert await count(engine, accounts, accounts.c.id == account_id) == 1

    run(scenario())


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
def test_schema_constraints_refuse_invalid_rows(migrated_url: str, statement: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            _, operation_id = await new_operation(engine, store, clock)
            async with engine.begin() as conn:
                with pytest.raises(IntegrityError):
                    await conn.execute(text(statement), {"op": operation_id})

    run(scenario())


def test_one_transfer_per_operation(migrated_url: str) -> None:
    async def scenario() -> None:
        clock = Clock()
        async with engine_for(migrated_url) as engine:
            store = SettlementStore(engine, clock=clock)
            _, operation_id = await new_operation(engine, store, clock)
            a, b = uuid.uuid4(), uuid.uuid4()
            async with engine.begin() as conn:
                for account in (a, b):
                    await conn.execute(
                        insert(accounts).values(
                            id=account, tenant="acme", currency="EUR", balance=100
                        )
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

    run(scenario())


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
