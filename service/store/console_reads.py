"""Reads the operator console shows beside the admin API's: the feed receipts that touched
one operation, and the principals of a tenant. Reads only; no authority."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.tables import feed_receipts, principals

__all__ = ["PrincipalRow", "ReceiptRow", "list_principals", "receipts_of"]

# The most receipts one operation page lists (the earliest decided first).
MAX_RECEIPTS = 100
# The most principals the console lists at once (newest first).
MAX_PRINCIPALS = 500


class ReceiptRow(msgspec.Struct):
    feed: str
    event_id: str
    event_order: int
    state: str
    reason: str
    first_seen_at: datetime
    decided_at: datetime


class PrincipalRow(msgspec.Struct):
    id: uuid.UUID
    tenant: str
    name: str
    role: str
    credential_generation: int
    all_tenants: bool
    created_at: datetime
    revoked_at: datetime | None


async def receipts_of(engine: AsyncEngine, operation_id: uuid.UUID) -> list[ReceiptRow]:
    stmt = (
        select(
            feed_receipts.c.feed,
            feed_receipts.c.event_id,
            feed_receipts.c.event_order,
            feed_receipts.c.state,
            feed_receipts.c.reason,
            feed_receipts.c.first_seen_at,
            feed_receipts.c.decided_at,
        )
        .where(feed_receipts.c.operation_id == operation_id)
        .order_by(feed_receipts.c.first_seen_at, feed_receipts.c.feed, feed_receipts.c.event_id)
        .limit(MAX_RECEIPTS)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    return [ReceiptRow(*row) for row in rows]


async def list_principals(engine: AsyncEngine, tenant: str | None) -> list[PrincipalRow]:
    """``tenant`` None: every tenant's."""
    stmt = select(
        principals.c.id,
        principals.c.tenant,
        principals.c.name,
        principals.c.role,
        principals.c.credential_generation,
        principals.c.all_tenants,
        principals.c.created_at,
        principals.c.revoked_at,
    )
    if tenant is not None:
        stmt = stmt.where(principals.c.tenant == tenant)
    stmt = stmt.order_by(principals.c.created_at.desc(), principals.c.id).limit(MAX_PRINCIPALS)
    async with engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    return [PrincipalRow(*row) for row in rows]
