"""The admin work list: operations by state, for reconciliation. Keyset-paginated."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import msgspec
from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.tables import operations

__all__ = ["BadCursor", "WorkItem", "WorkPage", "list_operations"]


class BadCursor(ValueError):
    status_hint = 400


class WorkItem(msgspec.Struct):
    id: uuid.UUID
    tenant: str
    principal_id: uuid.UUID
    key: str
    route: str
    state: str
    binding_generation: int
    revision: int
    created_at: datetime
    updated_at: datetime


# A cursor's timestamp is a row's created_at: anything outside these is not one of ours.
CURSOR_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
CURSOR_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


class WorkPage(msgspec.Struct):
    items: list[WorkItem]
    next: str | None


def _cursor(item: WorkItem) -> str:
    raw = f"{item.created_at.isoformat()}|{item.id}".encode()
    return base64.urlsafe_b64encode(raw).decode()


def _parse(cursor: str) -> tuple[datetime, uuid.UUID]:
    """A cursor this module made: an aware timestamp PostgreSQL can hold, and an id."""
    try:
        created, ident = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
        moment = datetime.fromisoformat(created)
        if moment.tzinfo is None or not CURSOR_EARLIEST <= moment <= CURSOR_LATEST:
            raise ValueError("timestamp out of range")
        # PostgreSQL compares in UTC; an odd offset (+23:59) must not reach the driver
        return moment.astimezone(UTC), uuid.UUID(ident)
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise BadCursor("malformed cursor") from exc


async def list_operations(
    engine: AsyncEngine, *, state: str, tenant: str | None, limit: int, after: str | None
) -> WorkPage:
    """Oldest first; ``tenant`` None means every tenant (an all-tenant admin)."""
    stmt = select(operations).where(operations.c.state == state)
    if tenant is not None:
        stmt = stmt.where(operations.c.tenant == tenant)
    if after is not None:
        created, ident = _parse(after)
        stmt = stmt.where(
            or_(
                operations.c.created_at > created,
                and_(operations.c.created_at == created, operations.c.id > ident),
            )
        )
    stmt = stmt.order_by(operations.c.created_at, operations.c.id).limit(limit + 1)
    async with engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    items = [
        WorkItem(
            id=r.id,
            tenant=r.tenant,
            principal_id=r.principal_id,
            key=r.idempotency_key,
            route=r.route,
            state=r.state,
            binding_generation=r.binding_generation,
            revision=r.revision,
            created_at=r.created_at,
            updated_at=r.updated_at,
        )
        for r in rows[:limit]
    ]
    return WorkPage(items=items, next=_cursor(items[-1]) if len(rows) > limit else None)
