"""Supersede racing a settlement on one row, over separate connections: one wins, the other
rereads and reruns its stages; no lost update and never a mixed-epoch row."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import select

from service.core import ObservationKind, OperationState, Scope, Supersede
from service.store.settlement import SettlementStore
from service.store.tables import observations, operation_epochs
from tests.conftest import run
from tests.integration.test_settlement_store import (
    Clock,
    completed,
    engine_for,
    new_operation,
)

pytestmark = pytest.mark.integration

ROUNDS = 12


def test_supersede_racing_a_settlement_never_mixes_epochs(migrated_url: str) -> None:
    async def nobody_holds(scopes: list[Scope]) -> list[float | None]:
        return [None for _ in scopes]

    async def one_round(clock: Clock, order: str) -> bool:
        async with engine_for(migrated_url) as setup:
            record, operation_id = await new_operation(
                setup, SettlementStore(setup, clock=clock), clock
            )
        async with engine_for(migrated_url) as a, engine_for(migrated_url) as b:
            settler = SettlementStore(a, clock=clock)
            admin = SettlementStore(b, clock=clock)
            settle = settler.settle(operation_id, completed(record, fencing_token=1))
            supersede = admin.supersede(
                operation_id,
                reason="race",
                admin_id=uuid.UUID(record.binding.principal_id),
                request_fingerprint=None,
                rebind=False,
                force=True,
                lease_remaining=nobody_holds,
            )
            if order == "settle-first":
                settled = await settle
                superseded = await supersede
            elif order == "supersede-first":
                superseded = await supersede
                settled = await settle
            else:
                settled, superseded = await asyncio.gather(settle, supersede)
            assert isinstance(superseded, Supersede)
            final = await settler.get(operation_id)
            assert final is not None
            # the new epoch is clean whatever the order
            assert final.tuple.binding_generation == 2
            assert final.state is OperationState.UNKNOWN
            assert final.result is None and final.conflict is None
            assert final.fencing_token == 2
            async with a.connect() as conn:
                epoch = (
                    await conn.execute(
                        select(operation_epochs).where(
                            operation_epochs.c.operation_id == operation_id
                        )
                    )
                ).one()
                obs = (
                    await conn.execute(
                        select(observations).where(
                            observations.c.operation_id == operation_id,
                            observations.c.kind == ObservationKind.COMPLETED.value,
                        )
                    )
                ).one()
            applied = settled.decision.disposition.value == "applied"
            if applied:  # the settlement won: the archived epoch carries its outcome
                assert epoch.final_state == "completed"
                assert epoch.result_digest == "d1"
                assert final.revision == record.revision + 2
            else:  # the supersede won: the old-epoch report was quarantined on reread
                assert obs.disposition == "quarantined"
                assert epoch.final_state == "in_progress"
                assert epoch.result_digest is None
                assert final.revision == record.revision + 1
            assert obs.disposition == settled.decision.disposition.value
            return applied

    async def scenario() -> None:
        clock = Clock()
        assert await one_round(clock, "settle-first") is True
        assert await one_round(clock, "supersede-first") is False
        for _ in range(ROUNDS):
            await one_round(clock, "concurrent")

    run(scenario())
