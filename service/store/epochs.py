"""The phases that are not one observation of one row: supersede and sweep.

Each builds a phase for :class:`~service.store.phase.PhaseRunner`: lock, ask the core (with
the lease's liveness through ``with_lease``), CAS, record.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

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
from service.store.outcomes import LeaseProbe, OperationNotFound, SweepCursor, SweepPage
from service.store.phase import Phase
from service.store.rows import at
from service.store.unit_of_work import StaleRevision, UnitOfWork

__all__ = ["supersede_phase", "sweep_phase"]

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
) -> Phase[SupersedeDecision]:
    """Start a new epoch under the row lock: archive the closed one, CAS on its tuple. An
    edited request's fingerprint is written with what it covers (``canonical_request``)."""

    async def phase(uow: UnitOfWork) -> SupersedeDecision:
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


def sweep_phase(
    batch: int,
    lease_remaining: LeaseProbe,
    after: SweepCursor | None,
    *,
    clock: Callable[[], float],
    policy: TerminalPolicy,
) -> Phase[SweepPage]:
    """Demote up to ``batch`` expired in_progress rows (``FOR UPDATE SKIP LOCKED``) whose
    lease the lease store no longer holds; a row whose CAS is refused is skipped."""

    async def phase(uow: UnitOfWork) -> SweepPage:
        now = clock()
        rows = await uow.expired_in_progress(at(now), batch, after)
        remaining = await lease_remaining([scope for scope, _, _ in rows])
        demoted: list[uuid.UUID] = []
        for (scope, stored, _), left in zip(rows, remaining, strict=True):
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
        last = rows[-1][2] if len(rows) == batch else None
        return SweepPage(demoted=demoted, next=last)

    return phase
