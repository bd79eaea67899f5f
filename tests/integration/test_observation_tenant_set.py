"""Every insert into ``observations`` sets its tenant itself, never leaving it to migration
0018's ``fill_tenant`` trigger (kept only for servers of revision 0017): the two rare cold
inserts that used to, a settle's observation about an operation gone meanwhile and a feed's
refused event, are run here with the trigger disabled in a database of the test's own, so
the tenant on the row is the code's. Real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from service.core import Claim, Source
from service.store.db import async_url
from service.store.feeds import FeedStore
from service.store.migrate import upgrade
from service.store.settlement import OperationNotFound, SettlementStore
from service.store.tables import observations
from tests.conftest import Services, create_database
from tests.integration.factories import (
    Clock,
    claim_request,
    completed,
    make_principal,
    make_scope,
    rows,
)

pytestmark = pytest.mark.integration

_OBSERVATIONS_TRIGGER = "ALTER TABLE observations {} TRIGGER fill_tenant"


@pytest.fixture
async def own_engine(services: Services) -> AsyncIterator[AsyncEngine]:
    """A database of this test's own, at head, with ``fill_tenant`` disabled on
    ``observations`` (enabled again before it is left)."""
    url = await create_database(services, "observation_tenant")
    await asyncio.to_thread(upgrade, url)
    engine = create_async_engine(async_url(url))
    async with engine.begin() as conn:
        await conn.execute(text(_OBSERVATIONS_TRIGGER.format("DISABLE")))
    try:
        yield engine
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(_OBSERVATIONS_TRIGGER.format("ENABLE")))
        await engine.dispose()


async def _operation(
    engine: AsyncEngine, store: SettlementStore, clock: Clock, tenant: str
) -> tuple[uuid.UUID, Claim]:
    principal = await make_principal(engine, tenant=tenant)
    outcome = await store.claim(
        make_scope(principal, tenant=tenant), claim_request(principal, clock)
    )
    assert isinstance(outcome.decision, Claim) and outcome.record is not None
    return uuid.UUID(outcome.record.reservation.operation_id), outcome.decision


async def _tenant_of_observation(engine: AsyncEngine, operation_id: uuid.UUID) -> str:
    (row,) = await rows(engine, observations, observations.c.operation_id == operation_id)
    assert row["reason"] in ("unknown-operation", "not-external", "operation-expired")
    tenant: str = row["tenant"]
    return tenant


async def test_the_trigger_is_off_so_an_insert_without_tenant_fails(
    own_engine: AsyncEngine,
) -> None:
    with pytest.raises(IntegrityError, match='column "tenant"'):
        async with own_engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO observations (operation_id, source, kind, verified, stage,"
                    " disposition, reason) VALUES (gen_random_uuid(), 'attempt', 'unknown',"
                    " false, 'A', 'quarantined', 'unknown-operation')"
                )
            )


async def test_a_settle_about_an_operation_gone_keeps_the_tenant_it_was_known_by(
    own_engine: AsyncEngine,
) -> None:
    clock = Clock()
    store = SettlementStore(own_engine, clock=clock)
    tenant = "t-" + uuid.uuid4().hex[:8]
    operation_id, claim = await _operation(own_engine, store, clock, tenant)
    # purged between the caller's read (which gave it the tenant) and the settle
    async with own_engine.begin() as conn:
        await conn.execute(text("DELETE FROM operations WHERE id = :id"), {"id": operation_id})
    with pytest.raises(OperationNotFound):
        await store.settle(operation_id, completed(claim.record), tenant=tenant)
    assert await _tenant_of_observation(own_engine, operation_id) == tenant


async def test_a_settle_about_no_operation_here_keeps_the_observers_tenant_else_none(
    own_engine: AsyncEngine,
) -> None:
    clock = Clock()
    store = SettlementStore(own_engine, clock=clock)
    _, claim = await _operation(own_engine, store, clock, "acme")
    observer = await make_principal(own_engine, tenant="observed", role="observer")
    reported, unreported = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(OperationNotFound):
        await store.settle(
            reported, completed(claim.record), detail={"principal_id": str(observer)}
        )
    with pytest.raises(OperationNotFound):
        await store.settle(unreported, completed(claim.record))
    assert await _tenant_of_observation(own_engine, reported) == "observed"
    assert await _tenant_of_observation(own_engine, unreported) == ""


async def test_a_feeds_refused_event_keeps_its_operations_tenant_else_none(
    own_engine: AsyncEngine,
) -> None:
    clock = Clock()
    store = SettlementStore(own_engine, clock=clock)
    feeds = FeedStore(own_engine, store.runner, settle=store.settle_phase_of)
    feed = "f" + uuid.uuid4().hex[:12]
    tenant = "t-" + uuid.uuid4().hex[:8]
    operation_id, claim = await _operation(own_engine, store, clock, tenant)
    observation = completed(claim.record, source=Source.FEED)
    now = datetime.now(UTC)
    await feeds.receipts.refuse_event(
        feed, "here", 1, operation_id, observation, "quarantined", "not-external", now
    )
    assert await _tenant_of_observation(own_engine, operation_id) == tenant
    gone = uuid.uuid4()
    await feeds.receipts.refuse_event(
        feed, "gone", 2, gone, observation, "quarantined", "operation-expired", now
    )
    assert await _tenant_of_observation(own_engine, gone) == ""


async def test_the_trigger_and_the_server_share_one_rule_for_no_operation_here(
    own_engine: AsyncEngine,
) -> None:
    """The trigger (for a server of revision 0017) gives what the server gives: the
    operation's tenant, else the observer's (``tenant_of_observer``), else ''."""
    observer = await make_principal(own_engine, tenant="observed", role="observer")
    async with own_engine.begin() as conn:
        await conn.execute(text(_OBSERVATIONS_TRIGGER.format("ENABLE")))
        tenants = (
            await conn.execute(
                text(
                    "INSERT INTO observations (operation_id, source, kind, verified, stage,"
                    " disposition, reason, detail) VALUES"
                    " (gen_random_uuid(), 'evidence', 'completed', true, 'A', 'quarantined',"
                    "  'unknown-operation', CAST(:detail AS jsonb)),"
                    " (gen_random_uuid(), 'feed', 'completed', true, 'A', 'quarantined',"
                    "  'unknown-operation', NULL)"
                    " RETURNING tenant"
                ),
                {"detail": f'{{"principal_id": "{observer}"}}'},
            )
        ).scalars()
        assert list(tenants) == ["observed", ""]
        await conn.execute(text(_OBSERVATIONS_TRIGGER.format("DISABLE")))
