"""Reads the operator console shows beside the admin API's: the feed receipts that touched
one operation, and the principals of a tenant. Reads only; no authority."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import msgspec
from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.feed_tables import feed_receipts
from service.store.tables import principals

__all__ = [
    "BadPrincipalCursor",
    "PrincipalPage",
    "PrincipalRow",
    "ReceiptRow",
    "list_principals",
    "receipts_of",
]

# The most receipts one operation page lists (the earliest decided first).
MAX_RECEIPTS = 100
# A principals page's cursor: the last row's created_at (microseconds since 1970, at most 16
# digits: before the year 2286) and id, the place the next page starts after.
_CURSOR = re.compile(r"([0-9]{1,16})\.([0-9a-f]{32})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class BadPrincipalCursor(ValueError):
    """A ``before`` cursor this module did not make."""


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


class PrincipalPage(msgspec.Struct):
    items: list[PrincipalRow]
    next: str | None
    """the cursor of the page after this one (older principals), None on the last page"""


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


async def list_principals(
    engine: AsyncEngine, tenant: str | None, limit: int, before: str | None = None
) -> PrincipalPage:
    """``limit`` principals, newest first, after the cursor ``before`` (BadPrincipalCursor
    if it is not one); ``tenant`` None: every tenant's."""
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
    if before is not None:
        at, after_id = _place(before)
        stmt = stmt.where(tuple_(principals.c.created_at, principals.c.id) < tuple_(at, after_id))
    stmt = stmt.order_by(principals.c.created_at.desc(), principals.c.id.desc()).limit(limit + 1)
    async with engine.connect() as conn:
        rows = [PrincipalRow(*row) for row in (await conn.execute(stmt)).all()]
    if len(rows) <= limit:
        return PrincipalPage(rows, None)
    last = rows[limit - 1]
    return PrincipalPage(rows[:limit], _cursor(last.created_at, last.id))


def _cursor(at: datetime, principal_id: uuid.UUID) -> str:
    return f"{(at - _EPOCH) // timedelta(microseconds=1)}.{principal_id.hex}"


def _place(cursor: str) -> tuple[datetime, uuid.UUID]:
    found = _CURSOR.fullmatch(cursor)
    if found is None:
        raise BadPrincipalCursor("malformed cursor: use the next page's link as given")
    micros, ident = found.groups()
    return _EPOCH + timedelta(microseconds=int(micros)), uuid.UUID(hex=ident)
