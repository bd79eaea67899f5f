"""The lease sweeper against real PostgreSQL and Redis."""

from __future__ import annotations

import uuid

import pytest

from service.app.sweeper import Sweeper
from service.config import Settings
from service.core import Claim, OperationState
from service.leases import LeaseManager, make_redis
from service.store.settlement import SettlementStore
from service.telemetry import Metrics
from tests.conftest import Services, run
from tests.integration.test_settlement_store import (
    LEASE,
    Clock,
    engine_for,
    make_principal,
    make_request,
    make_scope,
)

pytestmark = pytest.mark.integration


def test_sweeper_demotes_dead_attempts_and_pages_past_live_ones(
    services: Services, migrated_url: str
) -> None:
    async def scenario() -> None:
        clock = Clock()
        redis = make_redis(Settings.from_env({}), services.redis_url)
        try:
            async with engine_for(migrated_url) as engine:
                metrics = Metrics()
                store = SettlementStore(engine, clock=clock, hooks=metrics)
                leases = LeaseManager(redis, ttl=30, prefix=f"test:{uuid.uuid4().hex}:")
                principal_id = await make_principal(engine)
                ids, held = [], []
                for i in range(6):
                    scope = make_scope(principal_id)
                    outcome = await store.claim(scope, make_request(principal_id, clock))
                    assert isinstance(outcome.decision, Claim) and outcome.record
                    ids.append(uuid.UUID(outcome.record.tuple.operation_id))
                    if i % 2 == 0:  # these attempts are alive: their lease is in Redis
                        lease = await leases.acquire(scope.lease_name())
                        assert lease is not None
                        held.append(lease)
                clock.now += LEASE + 1  # every row's own lease column is now in the past

                sweeper = Sweeper(store, leases, metrics, interval=1, batch=2)
                demoted = await sweeper.run_once()
                while sweeper.more:
                    demoted += await sweeper.run_once()

                states = [(await store.get(i)).state for i in ids]  # type: ignore[union-attr]
                assert states == [
                    OperationState.IN_PROGRESS if i % 2 == 0 else OperationState.UNKNOWN
                    for i in range(6)
                ]
                assert demoted >= 3
                assert metrics.value("settlement_sweeper_demotions_total") == demoted
                # a second sweep finds nothing more to do for these rows
                for lease in held:
                    await leases.release(lease)
                again = await sweeper.run_once()
                while sweeper.more:
                    again += await sweeper.run_once()
                states = [(await store.get(i)).state for i in ids]  # type: ignore[union-attr]
                assert OperationState.IN_PROGRESS not in states
        finally:
            await redis.aclose()

    run(scenario())
