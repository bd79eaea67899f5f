"""The settlement store's read side: single statements, no lock, no transaction.

An operation's row by id or by scope, the request's first read (``identify``: the
principal, the scope's row and its tombstone in one statement on the hot path), an
operation's owner, and how much of one observer's evidence was quarantined lately.
:class:`service.store.settlement.SettlementStore` holds one as its ``reads``; callers reach
it there (``store.reads.get(...)``), so a read on the hot path costs one attribute lookup
more than a method of the store's own, and no call.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core import Record, Scope
from service.domain.principals import Principal
from service.store.db import reader
from service.store.hot import HotPath
from service.store.retention import Tombstone
from service.store.rows import at, record_from_row
from service.store.tables import operations
from service.store.unit_of_work import scope_predicate

__all__ = ["Quarantined", "SettlementReads"]


class Quarantined(msgspec.Struct, frozen=True):
    """One principal's evidence quarantined since a moment: how many, the oldest when."""

    count: int
    oldest: datetime | None


# through ix_observations_quarantined_evidence_by_principal (its predicate written out, so
# that a generic plan can use it); stops counting at :limit. An observer of one tenant's is
# counted in its tenant (_QUARANTINED_IN_TENANT); one of every tenant's, across them.
_COUNT_QUARANTINED = """
SELECT count(*) AS count, min(created_at) AS oldest FROM (
    SELECT created_at FROM observations
     WHERE {tenant}source = 'evidence' AND disposition = 'quarantined'
       AND (detail ->> 'principal_id') = :principal AND created_at > :since
     ORDER BY created_at
     LIMIT :limit
) q
"""
_QUARANTINED = text(
    "/* spans tenants: an observer of every tenant's refused evidence, in whichever tenant"
    " (a read) */" + _COUNT_QUARANTINED.format(tenant="")
)
_QUARANTINED_IN_TENANT = text(_COUNT_QUARANTINED.format(tenant="tenant = :tenant AND "))


# A read of an operation named by its id alone, by a caller that does not know its tenant
# (a provider's feed event, an observer of every tenant, a test)
_ANY_TENANT = (
    "/* spans tenants: an operation named by its id alone, its tenant unknown to the caller"
    " (a read by the id's index, no lock) */"
)


def _by_id(operation_id: uuid.UUID, tenant: str | None) -> tuple[Any, ...]:
    """The predicate of a read by id: pinned to ``tenant`` when it is known."""
    if tenant is None:
        return (operations.c.id == operation_id,)
    return (operations.c.tenant == tenant, operations.c.id == operation_id)


class SettlementReads:
    """Reads of operation rows (single statements, no lock)."""

    def __init__(
        self, engine: AsyncEngine, *, hot: HotPath | None, clock: Callable[[], float]
    ) -> None:
        """``hot``: the hot path (the store's, shared with its writes); without it a read
        by scope is a SQLAlchemy statement, and ``identify`` is refused."""
        self._reader = reader(engine)
        self._hot = hot
        self._clock = clock

    async def get(self, operation_id: uuid.UUID, tenant: str | None = None) -> Record | None:
        """The row of ``operation_id`` (of ``tenant``; None: of whichever tenant)."""
        return await self._read_one(*_by_id(operation_id, tenant), spans=tenant is None)

    async def get_by_scope(self, scope: Scope) -> Record | None:
        """The scope's row, one indexed read without a lock (the request's first read is
        ``identify``; this one is for re-reads: a 409's, a Prefer: wait's)."""
        if self._hot is not None:
            return await self._hot.by_scope(scope)
        return await self._read_one(*scope_predicate(scope))

    async def _read_one(self, *where: Any, spans: bool = False) -> Record | None:
        stmt = select(operations).where(*where)
        if spans:
            stmt = stmt.prefix_with(_ANY_TENANT)
        async with self._reader.connect() as conn:
            row = (await conn.execute(stmt)).mappings().first()
        return None if row is None else record_from_row(row)

    async def identify(
        self, key_hash: bytes, route: str, idempotency_key: str
    ) -> tuple[Principal, Record | None, Tombstone | None] | None:
        """The live principal whose key hashes to ``key_hash``, the row of its scope for
        (``route``, ``idempotency_key``) and the scope's tombstone if it stands now: one
        statement, no transaction (the hot path)."""
        if self._hot is None:
            raise RuntimeError("identify needs the store's HotPool")
        return await self._hot.identify(key_hash, route, idempotency_key, at(self._clock()))

    async def owner_of(
        self, operation_id: uuid.UUID, tenant: str | None = None
    ) -> tuple[str, str] | None:
        """(tenant, route) of an operation (of ``tenant``; None: of whichever tenant), or
        None."""
        stmt = select(operations.c.tenant, operations.c.route).where(*_by_id(operation_id, tenant))
        if tenant is None:
            stmt = stmt.prefix_with(_ANY_TENANT)
        async with self._reader.connect() as conn:
            row = (await conn.execute(stmt)).first()
        return None if row is None else (row.tenant, row.route)

    async def quarantined_evidence(
        self, principal_id: uuid.UUID, since: datetime, limit: int, tenant: str | None = None
    ) -> Quarantined:
        """The evidence ``principal_id`` sent that was quarantined after ``since`` (refused,
        or stopped at the tuple gate), counted up to ``limit``; in ``tenant`` (the
        observer's own), or in every tenant (None: an observer of every tenant)."""
        params: dict[str, Any] = {"principal": str(principal_id), "since": since, "limit": limit}
        stmt = _QUARANTINED
        if tenant is not None:
            stmt, params["tenant"] = _QUARANTINED_IN_TENANT, tenant
        async with self._reader.connect() as conn:
            row = (await conn.execute(stmt, params)).one()
        return Quarantined(count=int(row[0]), oldest=row[1])
