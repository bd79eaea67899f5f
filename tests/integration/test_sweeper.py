"""The lease sweeper against real PostgreSQL and Redis."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.routes import SCHEMA
from service.app.sweeper import Sweeper
from service.core import Claim, OperationState
from service.leases import LeaseManager
from service.store.settlement import SettlementStore
from service.telemetry import Metrics
from tests.citus_rules import Schema, spans_tenants, statement_findings
from tests.citus_statements import Recorder
from tests.integration.factories import LEASE, Clock, claim_request, make_principal, make_scope

pytestmark = pytest.mark.integration


async def test_sweeper_demotes_dead_attempts_and_pages_past_live_ones(
    engine: AsyncEngine, clock: Clock, leases: LeaseManager, principal_id: uuid.UUID
) -> None:
    metrics = Metrics()
    store = SettlementStore(engine, clock=clock, hooks=metrics)
    ids, held = [], []
    for i in range(6):
        scope = make_scope(principal_id)
        outcome = await store.claim(scope, claim_request(principal_id, clock))
        assert isinstance(outcome.decision, Claim) and outcome.record
        ids.append(uuid.UUID(outcome.record.reservation.operation_id))
        if i % 2 == 0:  # these attempts are alive: their lease is in Redis
            lease = await leases.acquire(scope.lease_name())
            assert lease is not None
            held.append(lease)
    clock.advance(LEASE + 1)  # every row's own lease column is now in the past

    sweeper = Sweeper(store, leases, metrics, interval=1, batch=2)
    demoted = await sweeper.run_once()
    while sweeper.more:
        demoted += await sweeper.run_once()

    states = [(await store.reads.get(i)).state for i in ids]  # type: ignore[union-attr]
    assert states == [
        OperationState.IN_PROGRESS if i % 2 == 0 else OperationState.UNKNOWN for i in range(6)
    ]
    assert demoted >= 3
    assert metrics.value("settlement_sweeper_demotions_total") == demoted
    # a second sweep finds nothing more to do for these rows
    for lease in held:
        await leases.release(lease)
    again = await sweeper.run_once()
    while sweeper.more:
        again += await sweeper.run_once()
    states = [(await store.reads.get(i)).state for i in ids]  # type: ignore[union-attr]
    assert OperationState.IN_PROGRESS not in states


async def test_the_sweeper_demotes_every_tenants_dead_attempts_locking_tenant_by_tenant(
    engine: AsyncEngine, clock: Clock, leases: LeaseManager
) -> None:
    """Two tenants with expired leases are both swept in one batch; every row lock it takes
    is pinned to one tenant (docs/scaling.md, Background jobs)."""
    metrics = Metrics()
    store = SettlementStore(engine, clock=clock, hooks=metrics)
    tenants = [f"sweep-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    ids = []
    for tenant in tenants:
        principal_id = await make_principal(engine, tenant)
        for _ in range(2):
            scope = make_scope(principal_id, tenant=tenant)
            outcome = await store.claim(scope, claim_request(principal_id, clock))
            assert isinstance(outcome.decision, Claim) and outcome.record
            ids.append(uuid.UUID(outcome.record.reservation.operation_id))
    clock.advance(LEASE + 1)

    sweeper = Sweeper(store, leases, metrics, interval=1, batch=100)
    with Recorder() as seen:
        demoted = await sweeper.run_once()
        while sweeper.more:
            demoted += await sweeper.run_once()

    states = [(await store.reads.get(i)).state for i in ids]  # type: ignore[union-attr]
    assert states == [OperationState.UNKNOWN] * 4
    assert demoted >= 4
    schema = Schema.of(SCHEMA)
    locks = [sql for sql in seen.executed if "FOR UPDATE" in sql]
    assert locks, "the sweep took no row lock"
    for sql in locks:
        assert statement_findings("sweep", sql, schema) == [], sql
    # what found them across tenants is a read, marked as spanning tenants
    found = [sql for sql in seen.executed if "lease_expires_at <" in sql and sql not in locks]
    assert found and all(spans_tenants(sql) for sql in found), found
