"""The admin work list: operations by state, for reconciliation. Keyset-paginated."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import Select, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store import keyset
from service.store.keyset import BadCursor
from service.store.tables import inline, operations

__all__ = [
    "BadCursor",
    "WorkItem",
    "WorkPage",
    "by_key",
    "count_operations",
    "list_by_key",
    "list_operations",
]

# The states of the work list, whose rows the open-work index covers.
WORK_STATES = ("unknown", "conflict", "in_progress")


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


class WorkPage(msgspec.Struct):
    items: list[WorkItem]
    next: str | None


def _parse(cursor: str) -> tuple[datetime, uuid.UUID]:
    created, ident = keyset.decode(cursor)
    try:
        return created, uuid.UUID(ident)
    except ValueError as exc:
        raise BadCursor("malformed cursor") from exc


async def list_operations(
    engine: AsyncEngine,
    *,
    state: str,
    tenant: str | None,
    limit: int,
    after: str | None,
    route: str | None = None,
    older_than: float | None = None,
    key: str | None = None,
) -> WorkPage:
    """Oldest first; ``tenant`` None means every tenant (an all-tenant admin); ``route``
    one route only; ``older_than``: last changed at least that many seconds ago; ``key``:
    of that Idempotency-Key only."""
    stmt = _of(tenant, select(operations).where(operations.c.state == inline(state)))
    if key is not None:
        stmt = stmt.where(operations.c.idempotency_key == key)
    if route is not None:
        stmt = stmt.where(operations.c.route == route)
    if older_than is not None:
        stmt = stmt.where(operations.c.updated_at <= func.now() - timedelta(seconds=older_than))
    if after is not None:
        created, ident = _parse(after)
        stmt = stmt.where(keyset.after(operations.c.created_at, operations.c.id, created, ident))
    return await _page(engine, stmt, limit)


async def list_by_key(
    engine: AsyncEngine, *, key: str, tenant: str | None, limit: int, after: str | None
) -> WorkPage:
    """The operations whose Idempotency-Key is ``key``, in any state, of any principal and
    route, oldest first: of ``tenant`` (pinned to it), or with None of every tenant."""
    return await _page(engine, by_key(key, tenant, after), limit)


def by_key(key: str, tenant: str | None, after: str | None) -> Select[Any]:
    """:func:`list_by_key`'s statement, before its order and limit."""
    stmt = select(operations).where(operations.c.idempotency_key == key)
    if tenant is not None:
        stmt = stmt.where(operations.c.tenant == tenant)
    else:  # an all-tenant admin's search over every tenant: it spans tenants on purpose
        stmt = stmt.prefix_with("/* spans tenants: an all-tenant admin's search by key */")
    if after is not None:
        created, ident = _parse(after)
        stmt = stmt.where(keyset.after(operations.c.created_at, operations.c.id, created, ident))
    return stmt


async def _page(engine: AsyncEngine, stmt: Select[Any], limit: int) -> WorkPage:
    """A page of ``stmt``'s operations, oldest first, with the cursor of the next."""
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
    last = items[-1] if len(rows) > limit else None
    return WorkPage(
        items=items, next=None if last is None else keyset.encode(last.created_at, str(last.id))
    )


def _of(tenant: str | None, stmt: Select[Any]) -> Select[Any]:
    """``stmt`` pinned to ``tenant``; with None, marked as spanning every tenant (an
    all-tenant admin's work list)."""
    if tenant is None:
        return stmt.prefix_with("/* spans tenants: an all-tenant admin's work list */")
    return stmt.where(operations.c.tenant == tenant)


async def count_operations(
    engine: AsyncEngine, *, tenant: str | None, route: str | None = None
) -> dict[str, int]:
    """How many operations each state of the work list holds (every state named, 0 too)."""
    stmt = (
        select(operations.c.state, func.count())
        .where(operations.c.state.in_([inline(state) for state in WORK_STATES]))
        .group_by(operations.c.state)
    )
    stmt = _of(tenant, stmt)
    if route is not None:
        stmt = stmt.where(operations.c.route == route)
    async with engine.connect() as conn:
        found = {state: int(n) for state, n in (await conn.execute(stmt)).all()}
    return {state: found.get(state, 0) for state in WORK_STATES}
