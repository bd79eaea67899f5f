"""Rows and values for the integration tests: one sensible default each, every field
overridable. Core values come from ``tests.unit.factories``; this module adds what needs a
real database (principals, scopes, operations) and the controllable clock."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core import Claim, ClaimRequest, Observation, Record, Scope
from service.store.settlement import SettlementStore
from service.store.tables import principals
from tests.unit.factories import make_binding, make_observation, make_request

__all__ = [
    "LEASE",
    "START",
    "Clock",
    "Scope",
    "claim_request",
    "completed",
    "count",
    "make_principal",
    "make_scope",
    "new_operation",
    "rows",
]

LEASE = 10.0
"""The lease a claiming request holds, in seconds of the test clock."""
START = 1_900_000_000.0
"""Where the test clock starts: a fixed time, so expiry is decided by ``advance`` alone."""


class Clock:
    """A controllable clock: the store takes time as a parameter, like the core."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


async def make_principal(engine: AsyncEngine, tenant: str = "acme", **overrides: Any) -> uuid.UUID:
    principal_id = uuid.uuid4()
    values: dict[str, Any] = {
        "id": principal_id,
        "tenant": tenant,
        "name": f"p-{principal_id.hex[:8]}",
        "role": "client",
        "key_hash": hashlib.sha256(principal_id.bytes).digest(),
    }
    values.update(overrides)
    async with engine.begin() as conn:
        await conn.execute(insert(principals).values(**values))
    return principal_id


def make_scope(principal_id: uuid.UUID, **overrides: Any) -> Scope:
    """A scope of its own (a fresh Idempotency-Key) unless ``idempotency_key`` is given."""
    fields: dict[str, Any] = {
        "tenant": "acme",
        "principal_id": principal_id,
        "route": "POST /v1/transfers",
        "idempotency_key": uuid.uuid4().hex,
    }
    fields.update(overrides)
    return Scope(**fields)


def claim_request(principal_id: uuid.UUID, clock: Clock, **overrides: Any) -> ClaimRequest:
    """A request of ``principal_id`` holding a lease of ``LEASE`` from the clock's now."""
    fields: dict[str, Any] = {
        "request_fingerprint": "f" * 64,
        "binding": make_binding(principal_id=str(principal_id)),
        "new_operation_id": str(uuid.uuid4()),
        "lease_expires_at": clock.now + LEASE,
    }
    fields.update(overrides)
    return make_request(**fields)


def completed(record: Record, digest: str = "d1", **overrides: Any) -> Observation:
    """An attempt's ``completed`` report about ``record``'s reservation."""
    return make_observation("completed", digest=digest, reservation=record.reservation, **overrides)


async def new_operation(
    engine: AsyncEngine, store: SettlementStore, clock: Clock
) -> tuple[Record, uuid.UUID]:
    """A freshly claimed operation (``in_progress``, revision 1, fencing token 1)."""
    principal_id = await make_principal(engine)
    outcome = await store.claim(make_scope(principal_id), claim_request(principal_id, clock))
    assert isinstance(outcome.decision, Claim) and outcome.record is not None
    return outcome.record, uuid.UUID(outcome.record.reservation.operation_id)


async def count(engine: AsyncEngine, table: Any, *where: Any) -> int:
    async with engine.connect() as conn:
        stmt = select(func.count()).select_from(table).where(*where)
        return int((await conn.execute(stmt)).scalar_one())


async def rows(
    engine: AsyncEngine, table: Any, *where: Any, order_by: Any = None
) -> list[RowMapping]:
    async with engine.connect() as conn:
        stmt = select(table).where(*where)
        if order_by is not None:
            stmt = stmt.order_by(order_by)
        return list((await conn.execute(stmt)).mappings().all())
