"""One transaction is one atomic phase; the row lock lives behind ``get_for_update``.

``async with UnitOfWork(engine) as uow:`` opens a connection and a transaction; leaving the
block without ``await uow.commit()`` rolls everything back.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, cast, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncTransaction

from service.core import Archived, Decision, Observation, Record, ReservationTuple, Scope
from service.errors import SettlementError
from service.store.rows import observation_values, record_from_row, record_values, to_ts
from service.store.tables import (
    attempts,
    inline,
    observations,
    operation_epochs,
    operations,
    principals,
)

__all__ = ["AttemptEnd", "StaleRevision", "UnitOfWork", "observer_tenant", "scope_predicate"]


class AttemptEnd(msgspec.Struct, frozen=True):
    """How an attempt ended, for its row."""

    attempt_id: uuid.UUID
    outcome: str
    status: int | None
    error: str | None
    at: datetime


class StaleRevision(SettlementError):
    """The CAS predicate (tuple + revision) matched no row: someone wrote first (the phase
    runner reruns the phase; it leaves the store only as :class:`SettlementContention`)."""

    problem = "service-unavailable"


# An operation named by its id alone (an observation of it, an admin's supersede): its tenant,
# so that the lock and the write after it are pinned to it.
_TENANT_OF = text(
    "/* spans tenants: an operation named by its id alone; this finds its tenant (by the id's"
    " index, no lock), and the row is then locked and written pinned to it */"
    " SELECT tenant FROM operations WHERE id = :id"
)


def observer_tenant(detail: dict[str, Any] | None) -> ColumnElement[str]:
    """The tenant of an observation about an operation that is not here: its observer's
    (``detail["principal_id"]``), else ``''``. The rule is the database's function
    ``tenant_of_observer`` (migration 0019), the one migration 0018's ``fill_tenant``
    trigger applies too, so it is written once; it reads only ``principals``."""
    return func.tenant_of_observer(cast(detail, JSONB))


class UnitOfWork:
    def __init__(self, engine: AsyncEngine, tenant: str | None = None) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None
        self._tx: AsyncTransaction | None = None
        self.tenant = tenant
        """the one tenant this transaction works in (one shard on Citus): set by the caller
        that knows it, by a lock by scope, or found from the operation id (:meth:`pinned`)"""

    async def __aenter__(self) -> UnitOfWork:
        self._conn = await self._engine.connect()
        self._tx = await self._conn.begin()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._conn is not None and self._tx is not None
        try:
            if self._tx.is_active:
                await self._tx.rollback()
        finally:
            await self._conn.close()
            self._conn = self._tx = None

    @property
    def connection(self) -> AsyncConnection:
        assert self._conn is not None, "UnitOfWork used outside its async with block"
        return self._conn

    async def commit(self) -> None:
        assert self._tx is not None
        await self._tx.commit()

    # -- reads under lock -------------------------------------------------------------------

    async def pinned(self, operation_id: uuid.UUID) -> str | None:
        """The tenant this transaction works in, found from ``operation_id`` when nobody set
        it (None: no such operation)."""
        if self.tenant is None:
            self.tenant = (
                await self.connection.execute(_TENANT_OF, {"id": operation_id})
            ).scalar_one_or_none()
        return self.tenant

    async def get_for_update_by_scope(self, scope: Scope) -> Record | None:
        """Lock the row of a scope (if any) for the rest of this transaction."""
        self.tenant = scope.tenant
        row = (
            (
                await self.connection.execute(
                    select(operations).where(*scope_predicate(scope)).with_for_update()
                )
            )
            .mappings()
            .first()
        )
        return None if row is None else record_from_row(row)

    async def get_for_update_with_scope(
        self, operation_id: uuid.UUID
    ) -> tuple[Scope, Record] | None:
        """Lock the operation row (pinned to its tenant) and return it with its scope."""
        tenant = await self.pinned(operation_id)
        if tenant is None:
            return None
        row = (
            (
                await self.connection.execute(
                    select(operations)
                    .where(operations.c.tenant == tenant, operations.c.id == operation_id)
                    .with_for_update()
                )
            )
            .mappings()
            .first()
        )
        return None if row is None else (_scope_of(row), record_from_row(row))

    async def credential_generation(self, principal_id: uuid.UUID) -> int:
        generation: int = (
            await self.connection.execute(
                select(principals.c.credential_generation).where(principals.c.id == principal_id)
            )
        ).scalar_one()
        return generation

    async def archive_epoch(
        self,
        operation_id: uuid.UUID,
        archived: Archived,
        reason: str,
        admin_id: uuid.UUID,
        now: datetime,
        *,
        tenant: str,
    ) -> None:
        """The epoch ``archived`` of ``tenant``'s operation ``operation_id``."""
        await self.connection.execute(
            insert(operation_epochs).values(
                tenant=tenant,
                operation_id=operation_id,
                binding_generation=archived.reservation.binding_generation,
                request_fingerprint=archived.reservation.request_fingerprint,
                bound_principal_id=uuid.UUID(archived.binding.principal_id),
                bound_credential_generation=archived.binding.credential_generation,
                final_state=archived.final_state.value,
                result_digest=archived.result_digest,
                reason=reason,
                superseded_by=admin_id,
                superseded_at=now,
            )
        )

    async def expired_in_progress(
        self, tenant: str, ids: Sequence[uuid.UUID], now: datetime
    ) -> list[tuple[Scope, Record]]:
        """Lock those of ``tenant``'s rows ``ids`` that are still in_progress with their lease
        ended, in (lease end, id) order, skipping rows another transaction holds."""
        self.tenant = tenant
        stmt = select(operations).where(
            operations.c.tenant == tenant,
            operations.c.id.in_(ids),
            operations.c.state == inline("in_progress"),
            operations.c.lease_expires_at < now,
        )
        rows = (
            (
                await self.connection.execute(
                    stmt.order_by(operations.c.lease_expires_at, operations.c.id).with_for_update(
                        skip_locked=True
                    )
                )
            )
            .mappings()
            .all()
        )
        return [(_scope_of(row), record_from_row(row)) for row in rows]

    # -- writes -----------------------------------------------------------------------------

    async def insert_operation(
        self, scope: Scope, record: Record, now: datetime, **extra: Any
    ) -> bool:
        """Insert a new row for ``scope``; False when another claimer inserted it first."""
        stmt = (
            pg_insert(operations)
            .values(
                id=uuid.UUID(record.reservation.operation_id),
                tenant=scope.tenant,
                principal_id=scope.principal_id,
                route=scope.route,
                idempotency_key=scope.idempotency_key,
                created_at=now,
                updated_at=now,
                **record_values(record),
                **extra,
            )
            .on_conflict_do_nothing(constraint="uq_operations_scope")
            .returning(operations.c.id)
        )
        return (await self.connection.execute(stmt)).first() is not None

    async def cas_write(
        self,
        record: Record,
        expected_revision: int,
        now: datetime,
        *,
        expected_tuple: ReservationTuple | None = None,
        **extra: Any,
    ) -> None:
        """Write ``record`` only if the row still has ``expected_tuple`` (default: the
        record's own) and ``expected_revision``; pinned to the tenant of the row locked."""
        reservation = expected_tuple or record.reservation
        operation_id = uuid.UUID(reservation.operation_id)
        stmt = (
            update(operations)
            .where(
                operations.c.tenant == await self.pinned(operation_id),
                operations.c.id == operation_id,
                operations.c.request_fingerprint == reservation.request_fingerprint,
                operations.c.binding_generation == reservation.binding_generation,
                operations.c.revision == expected_revision,
            )
            .values(updated_at=now, **record_values(record), **extra)
            .returning(operations.c.revision)
        )
        if (await self.connection.execute(stmt)).first() is None:
            raise StaleRevision(
                f"operation {reservation.operation_id}: revision {expected_revision} is stale"
            )

    async def insert_attempt(
        self,
        attempt_id: uuid.UUID,
        record: Record,
        lease_token: str | None,
        now: datetime,
        *,
        tenant: str,
    ) -> None:
        """The per-attempt row of ``tenant``'s operation: what this attempt holds (never read
        as authority)."""
        operation_id = uuid.UUID(record.reservation.operation_id)
        await self.connection.execute(
            insert(attempts).values(
                tenant=tenant,
                id=attempt_id,
                operation_id=operation_id,
                fencing_token=record.fencing_token,
                binding_generation=record.reservation.binding_generation,
                lease_token=lease_token,
                lease_expires_at=to_ts(record.lease_expires_at),
                started_at=now,
            )
        )

    async def record_observation(
        self,
        operation_id: uuid.UUID | None,
        observation: Observation,
        *,
        stage: str,
        disposition: str,
        reason: str,
        revision_before: int | None,
        revision_after: int | None,
        attempt_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
        tenant: str | ColumnElement[str],
        finish_attempt: AttemptEnd | None = None,
    ) -> int:
        """Insert the observation row with the stage and disposition that decided it.

        ``tenant``: the operation's; about an operation that is not here,
        :func:`observer_tenant` (the row never leaves it to migration 0018's trigger,
        which only a server of revision 0017 still relies on).

        In the same statement (one round trip): close the attempt row (``finish_attempt``).
        """
        inserted = (
            insert(observations)
            .values(
                tenant=tenant,
                operation_id=operation_id,
                **observation_values(observation),
                stage=stage,
                disposition=disposition,
                reason=reason,
                revision_before=revision_before,
                revision_after=revision_after,
                attempt_id=attempt_id,
                detail=detail,
            )
            .returning(observations.c.id)
            .cte("recorded")
        )
        stmt = select(inserted.c.id)
        if finish_attempt is not None:
            pinned = self.tenant if operation_id is None else await self.pinned(operation_id)
            closed = (
                update(attempts)
                .where(attempts.c.tenant == pinned, attempts.c.id == finish_attempt.attempt_id)
                .values(
                    finished_at=finish_attempt.at,
                    outcome=finish_attempt.outcome,
                    response_status=finish_attempt.status,
                    error=finish_attempt.error,
                )
                .returning(attempts.c.id)
                .cte("closed")
            )
            stmt = stmt.add_cte(closed)
        return int((await self.connection.execute(stmt)).first()[0])  # type: ignore[index]

    async def record_decision(
        self,
        operation_id: uuid.UUID,
        observation: Observation,
        decision: Decision,
        revision_before: int,
        *,
        tenant: str,
        **kwargs: Any,
    ) -> int:
        revision_after = getattr(decision, "record", None)
        return await self.record_observation(
            operation_id,
            observation,
            stage=decision.stage.value,
            disposition=decision.disposition.value,
            reason=decision.reason.value,
            revision_before=revision_before,
            revision_after=revision_after.revision if revision_after else revision_before,
            tenant=tenant,
            **kwargs,
        )


def _scope_of(row: Any) -> Scope:
    return Scope(
        tenant=row["tenant"],
        principal_id=row["principal_id"],
        route=row["route"],
        idempotency_key=row["idempotency_key"],
    )


def scope_predicate(scope: Scope) -> tuple[Any, ...]:
    return (
        operations.c.tenant == scope.tenant,
        operations.c.principal_id == scope.principal_id,
        operations.c.route == scope.route,
        operations.c.idempotency_key == scope.idempotency_key,
    )
