"""Supersede racing a settlement on one row, over separate connections: one wins, the other
rereads and reruns its stages; no lost update and never a mixed-epoch row."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core import ObservationKind, OperationState, Supersede
from service.store.settlement import SettlementStore
from service.store.tables import observations, operation_epochs
from tests.integration.factories import Clock, Scope, completed, new_operation, rows

pytestmark = pytest.mark.integration

ROUNDS = 12


async def test_supersede_racing_a_settlement_never_mixes_epochs(
    engine: AsyncEngine,
    store: SettlementStore,
    clock: Clock,
    open_engine: Callable[[], AsyncEngine],
) -> None:
    # the settler and the admin each have a connection pool of their own
    settler = SettlementStore(open_engine(), clock=clock)
    admin = SettlementStore(open_engine(), clock=clock)

    async def nobody_holds(scopes: list[Scope]) -> list[float | None]:
        return [None for _ in scopes]

    async def one_round(order: str) -> bool:
        record, operation_id = await new_operation(engine, store, clock)
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
        final = await settler.reads.get(operation_id)
        assert final is not None
        # the new epoch is clean whatever the order
        assert final.reservation.binding_generation == 2
        assert final.state is OperationState.UNKNOWN
        assert final.result is None and final.conflict is None
        assert final.fencing_token == 2
        (epoch,) = await rows(
            engine, operation_epochs, operation_epochs.c.operation_id == operation_id
        )
        (obs,) = await rows(
            engine,
            observations,
            observations.c.operation_id == operation_id,
            observations.c.kind == ObservationKind.COMPLETED.value,
        )
        applied = settled.decision.disposition.value == "applied"
        if applied:  # the settlement won: the archived epoch carries its outcome
            assert epoch["final_state"] == "completed"
            assert epoch["result_digest"] == "d1"
            assert final.revision == record.revision + 2
        else:  # the supersede won: the old-epoch report was quarantined on reread
            assert obs["disposition"] == "quarantined"
            assert epoch["final_state"] == "in_progress"
            assert epoch["result_digest"] is None
            assert final.revision == record.revision + 1
        assert obs["disposition"] == settled.decision.disposition.value
        return applied

    assert await one_round("settle-first") is True
    assert await one_round("supersede-first") is False
    for _ in range(ROUNDS):
        await one_round("concurrent")
