"""The phases that are not one observation of one row: supersede and sweep (tenant by tenant).

Each builds a phase for :class:`~service.store.phase.PhaseRunner`: lock, ask the core (with
the lease's liveness through ``with_lease``), CAS, record.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core import (
    Apply,
    Binding,
    Observation,
    ObservationKind,
    OperationState,
    Refuse,
    Source,
    SupersedeDecision,
    SupersedeRequest,
    TerminalPolicy,
    decide_supersede,
    settle,
    with_lease,
)
from service.store.outcomes import LeaseProbe, OperationNotFound, SweepCursor
from service.store.phase import Phase
from service.store.rows import at
from service.store.unit_of_work import StaleRevision, UnitOfWork

__all__ = ["by_tenant", "expired_leases", "supersede_phase", "sweep_phase"]

log = logging.getLogger("settlement.store")


def supersede_phase(
    operation_id: uuid.UUID,
    request: SupersedeRequest,
    *,
    rebind: bool,
    reason: str,
    admin_id: uuid.UUID,
    clock: Callable[[], float],
    lease_remaining: LeaseProbe,
    canonical_request: str | None = None,
    tenant: str | None = None,
) -> Phase[SupersedeDecision]:
    """Start a new epoch under the row lock: archive the closed one, CAS on its tuple. An
    edited request's fingerprint is written with what it covers (``canonical_request``)."""

    async def phase(uow: UnitOfWork) -> SupersedeDecision:
        uow.tenant = tenant or uow.tenant
        found = await uow.get_for_update_with_scope(operation_id)
        if found is None:
            raise OperationNotFound(str(operation_id))
        scope, record = found
        now = clock()
        if record.state is OperationState.IN_PROGRESS:  # the lease lives in Redis, not the row
            (remaining,) = await lease_remaining([scope])
            record = with_lease(record, remaining, now)
        binding = None
        if rebind:
            generation = await uow.credential_generation(scope.principal_id)
            binding = Binding(str(scope.principal_id), generation)
        decision = decide_supersede(record, msgspec.structs.replace(request, binding=binding), now)
        if isinstance(decision, Refuse):
            return decision
        await uow.cas_write(
            decision.record,
            decision.expected_revision,
            at(now),
            expected_tuple=decision.archived.reservation,
            expires_at=None,
            current_attempt_id=None,
            **_edited(request, canonical_request),
        )
        await uow.archive_epoch(
            operation_id, decision.archived, reason, admin_id, at(now), tenant=scope.tenant
        )
        return decision

    return phase


def _edited(request: SupersedeRequest, canonical_request: str | None) -> dict[str, Any]:
    """The request column's write: with an edited fingerprint only (a rebind keeps both)."""
    if request.request_fingerprint is None:
        return {}
    return {"canonical_request": canonical_request}


# The rows whose lease ended, in every tenant, a page at a time: a read without a lock
# (through ix_operations_in_progress_lease); the sweep then locks them tenant by tenant.
_SPANS = (
    "/* spans tenants: the sweeper finds the in_progress rows whose lease ended in every "
    "tenant (a read, no lock); it locks and demotes them tenant by tenant */"
)
_EXPIRED = f"""{_SPANS}
SELECT tenant, id, lease_expires_at FROM operations
 WHERE state = 'in_progress' AND lease_expires_at < :now{{after}}
 ORDER BY lease_expires_at, id
 LIMIT :batch"""
_EXPIRED_LEASES = text(_EXPIRED.format(after=""))
_EXPIRED_LEASES_AFTER = text(
    _EXPIRED.format(after="\n   AND (lease_expires_at, id) > (:after_at, :after_id)")
)


async def expired_leases(
    conn: AsyncConnection, now: datetime, batch: int, after: SweepCursor | None
) -> list[tuple[str, uuid.UUID, SweepCursor]]:
    """Up to ``batch`` in_progress rows of any tenant whose lease column ended before
    ``now``, in (lease end, id) order after ``after``: (tenant, id, cursor)."""
    params: dict[str, Any] = {"now": now, "batch": batch}
    stmt = _EXPIRED_LEASES
    if after is not None:
        stmt = _EXPIRED_LEASES_AFTER
        params |= {"after_at": after[0], "after_id": after[1]}
    rows = (await conn.execute(stmt, params)).all()
    return [(row.tenant, row.id, (row.lease_expires_at, row.id)) for row in rows]


def by_tenant(
    found: Sequence[tuple[str, uuid.UUID, SweepCursor]],
) -> dict[str, list[uuid.UUID]]:
    """The ids found, per tenant (tenants in the order they first appear)."""
    grouped: dict[str, list[uuid.UUID]] = {}
    for tenant, operation_id, _ in found:
        grouped.setdefault(tenant, []).append(operation_id)
    return grouped


def sweep_phase(
    tenant: str,
    ids: Sequence[uuid.UUID],
    lease_remaining: LeaseProbe,
    *,
    clock: Callable[[], float],
    policy: TerminalPolicy,
) -> Phase[list[uuid.UUID]]:
    """Demote those of ``tenant``'s rows ``ids`` still in_progress with an expired lease
    (``FOR UPDATE SKIP LOCKED``) whose lease the lease store no longer holds; a row whose CAS
    is refused is skipped. The phase returns the ids demoted."""

    async def phase(uow: UnitOfWork) -> list[uuid.UUID]:
        now = clock()
        rows = await uow.expired_in_progress(tenant, ids, at(now))
        remaining = await lease_remaining([scope for scope, _ in rows])
        demoted: list[uuid.UUID] = []
        for (scope, stored), left in zip(rows, remaining, strict=True):
            record = with_lease(stored, left, now)
            operation_id = uuid.UUID(record.reservation.operation_id)
            observation = Observation(
                reservation=record.reservation, kind=ObservationKind.UNKNOWN, source=Source.SWEEPER
            )
            decision = settle(record, observation, now, policy)
            if not isinstance(decision, Apply):
                continue  # the lease is still held: nothing to say about this row
            try:
                await uow.cas_write(decision.record, decision.expected_revision, at(now))
            except StaleRevision:
                log.warning(
                    "sweep CAS refused; row skipped", extra={"operation_id": str(operation_id)}
                )
                continue
            await uow.record_decision(
                operation_id, observation, decision, record.revision, tenant=scope.tenant
            )
            demoted.append(operation_id)
        return demoted

    return phase
