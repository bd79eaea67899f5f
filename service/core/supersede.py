"""Supersede: start a new reservation epoch of an operation (admin only).

Rules, first match wins:

    row completed, without force             -> Refuse COMPLETED_NEEDS_FORCE (the effect
                                                could run again: that must be asked for)
    row in conflict, without force           -> Refuse CONFLICT_NEEDS_FORCE (a conflict holds
                                                a completed outcome, or two different
                                                failures: the effect may have happened)
    external effect whose outcome is not known
      (row unknown or in_progress), no force -> Refuse OUTCOME_UNKNOWN_NEEDS_FORCE (the old
                                                epoch may have taken effect downstream under
                                                its own sink key; a new epoch sends a new one)
    row in_progress with a live lease,
      without force                          -> Refuse LIVE_ATTEMPT
    otherwise                                -> Supersede: archive the epoch as it stands
                                                (tuple, final state, result digest), then
                                                binding_generation + 1, the new fingerprint
                                                (if the request was edited), the new binding,
                                                fencing token + 1 (a running attempt is fenced
                                                out), state unknown, result/conflict/lease
                                                cleared, revision + 1.
                                                ``effect_may_run_again`` when the row was
                                                completed or in conflict, or an external
                                                outcome unknown.

Anything the old epoch still reports (a late answer, evidence, a stale worker's commit)
names the old tuple or token and is quarantined or ignored by ``settle``.
"""

from __future__ import annotations

import enum

import msgspec

from service.core.model import Binding, OperationState, Record, ReservationTuple

__all__ = [
    "Archived",
    "Refuse",
    "RefuseReason",
    "Supersede",
    "SupersedeDecision",
    "SupersedeRequest",
    "decide_supersede",
]


class SupersedeRequest(msgspec.Struct, frozen=True):
    """``request_fingerprint`` None keeps the fingerprint; ``binding`` None keeps the binding."""

    request_fingerprint: str | None = None
    binding: Binding | None = None
    force: bool = False
    external: bool = False


class RefuseReason(enum.StrEnum):
    COMPLETED_NEEDS_FORCE = "completed-needs-force"
    CONFLICT_NEEDS_FORCE = "conflict-needs-force"
    OUTCOME_UNKNOWN_NEEDS_FORCE = "outcome-unknown-needs-force"
    LIVE_ATTEMPT = "live-attempt"


class Archived(msgspec.Struct, frozen=True):
    """The epoch being closed, as it is archived."""

    reservation: ReservationTuple
    binding: Binding
    final_state: OperationState
    result_digest: str | None


class Supersede(msgspec.Struct, frozen=True, tag="supersede"):
    record: Record
    expected_revision: int
    archived: Archived
    reran_completed: bool
    fenced_live_attempt: bool
    effect_may_run_again: bool
    """completed or in conflict before, or an external effect whose outcome was not known:
    the new epoch may make the effect happen a second time"""


class Refuse(msgspec.Struct, frozen=True, tag="refuse"):
    reason: RefuseReason


SupersedeDecision = Supersede | Refuse


def decide_supersede(record: Record, request: SupersedeRequest, now: float) -> SupersedeDecision:
    """Decide a supersede of ``record``. Pure."""
    completed = record.state is OperationState.COMPLETED
    conflicted = record.state is OperationState.CONFLICT
    live = record.lease_valid(now)
    if completed and not request.force:
        return Refuse(reason=RefuseReason.COMPLETED_NEEDS_FORCE)
    if conflicted and not request.force:
        return Refuse(reason=RefuseReason.CONFLICT_NEEDS_FORCE)
    undecided = record.state in (OperationState.UNKNOWN, OperationState.IN_PROGRESS)
    if request.external and undecided and not request.force:
        return Refuse(reason=RefuseReason.OUTCOME_UNKNOWN_NEEDS_FORCE)
    if live and not request.force:
        return Refuse(reason=RefuseReason.LIVE_ATTEMPT)
    archived = Archived(
        reservation=record.reservation,
        binding=record.binding,
        final_state=record.state,
        result_digest=record.result.digest if record.result is not None else None,
    )
    reservation = ReservationTuple(
        operation_id=record.reservation.operation_id,
        request_fingerprint=request.request_fingerprint or record.reservation.request_fingerprint,
        binding_generation=record.reservation.binding_generation + 1,
    )
    fresh = msgspec.structs.replace(
        record,
        reservation=reservation,
        binding=request.binding or record.binding,
        state=OperationState.UNKNOWN,
        revision=record.revision + 1,
        fencing_token=record.fencing_token + 1,
        lease_expires_at=None,
        result=None,
        conflict=None,
    )
    return Supersede(
        record=fresh,
        expected_revision=record.revision,
        archived=archived,
        reran_completed=completed,
        fenced_live_attempt=live,
        effect_may_run_again=completed or conflicted or (request.external and undecided),
    )
