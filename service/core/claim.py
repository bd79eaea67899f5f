"""What a new client request does against the operation row found for its scope.

Rules (docs/design.md §5 steps 2 and 4), first match wins:

    no row                                   -> Claim NEW (first attempt, fencing token 1)
    fingerprint differs from the reservation -> FingerprintMismatch (422)
    binding differs from the reservation     -> BindingMismatch (409, needs a supersede)
    row in conflict                          -> OperationConflict (409)
    row completed or failed                  -> Replay the stored result
    row in_progress with a valid lease       -> InProgress (409 or wait)
    row in_progress whose lease is gone      -> Claim DEMOTE_STALE (demotion recorded, then claim)
    row unknown                              -> Claim FROM_UNKNOWN

After an attempt, ``attempt_answer`` says what its client is told from the row as it stands:

    row in conflict                          -> OperationConflict (409)
    row completed or failed                  -> Replay; ``replayed`` False only when this
                                                attempt's own settlement stored the outcome
    row not terminal                         -> Unsettled (the caller says why: unknown, lost)

A claim moves the row to in_progress under a new fencing token (previous + 1) with the
claimer's lease, and bumps the revision; the shell writes it with the tuple + revision CAS.
"""

from __future__ import annotations

import enum

import msgspec

from service.core.model import (
    Binding,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    ReservationTuple,
    Result,
    Source,
)

__all__ = [
    "AttemptAnswer",
    "BindingMismatch",
    "Claim",
    "ClaimDecision",
    "ClaimKind",
    "ClaimRequest",
    "FingerprintMismatch",
    "InProgress",
    "OperationConflict",
    "Replay",
    "Superseded",
    "Unsettled",
    "attempt_answer",
    "decide_claim",
]


class ClaimRequest(msgspec.Struct, frozen=True):
    """A client request as the core needs it.

    ``new_operation_id`` is used only when no row exists (ids are made by the shell);
    ``lease_expires_at`` is when the lease this request holds (or would hold) ends;
    ``canonical_request`` is what the fingerprint covers (JSON text), which a new row keeps
    to show what was asked: the core decides nothing on it.
    """

    request_fingerprint: str
    binding: Binding
    new_operation_id: str
    lease_expires_at: float
    canonical_request: str | None = None


class ClaimKind(enum.StrEnum):
    NEW = "new"
    FROM_UNKNOWN = "from_unknown"
    DEMOTE_STALE = "demote_stale"


class Claim(msgspec.Struct, frozen=True, tag="claim"):
    """Insert (NEW) or CAS-update the row to ``record``; ``expected_revision`` is None on insert.

    ``demotion`` is the observation to record first when a stale in_progress was demoted.
    """

    kind: ClaimKind
    record: Record
    expected_revision: int | None
    demotion: Observation | None = None


class Replay(msgspec.Struct, frozen=True, tag="replay"):
    """Answer with the stored result. ``replayed`` is False only for the attempt whose own
    settlement stored it."""

    result: Result
    state: OperationState
    operation_id: str
    replayed: bool = True


class FingerprintMismatch(msgspec.Struct, frozen=True, tag="fingerprint_mismatch"):
    operation_id: str


class BindingMismatch(msgspec.Struct, frozen=True, tag="binding_mismatch"):
    operation_id: str


class OperationConflict(msgspec.Struct, frozen=True, tag="operation_conflict"):
    operation_id: str


class InProgress(msgspec.Struct, frozen=True, tag="in_progress"):
    operation_id: str
    lease_expires_at: float


class Unsettled(msgspec.Struct, frozen=True, tag="unsettled"):
    """The attempt ended and the row is still not terminal: no outcome to answer with."""

    operation_id: str
    state: OperationState
    lease_expires_at: float | None


class Superseded(msgspec.Struct, frozen=True, tag="superseded"):
    """An admin started a new epoch while the attempt ran: its outcome (if any) belongs to
    the old epoch, kept as an observation; the row is the new epoch's."""

    operation_id: str
    binding_generation: int
    state: OperationState


ClaimDecision = (
    Claim | Replay | FingerprintMismatch | BindingMismatch | OperationConflict | InProgress
)
AttemptAnswer = Replay | OperationConflict | Unsettled | Superseded


def decide_claim(record: Record | None, request: ClaimRequest, now: float) -> ClaimDecision:
    """Decide what a request does with the row of its scope. Pure."""
    if record is None:
        fresh = Record(
            reservation=ReservationTuple(
                operation_id=request.new_operation_id,
                request_fingerprint=request.request_fingerprint,
                binding_generation=1,
            ),
            binding=request.binding,
            state=OperationState.IN_PROGRESS,
            revision=1,
            fencing_token=1,
            lease_expires_at=request.lease_expires_at,
        )
        return Claim(kind=ClaimKind.NEW, record=fresh, expected_revision=None)

    operation_id = record.reservation.operation_id
    if record.reservation.request_fingerprint != request.request_fingerprint:
        return FingerprintMismatch(operation_id=operation_id)
    if record.binding != request.binding:
        return BindingMismatch(operation_id=operation_id)
    if record.state is OperationState.CONFLICT:
        return OperationConflict(operation_id=operation_id)
    if record.state.terminal:
        assert record.result is not None  # a completed or failed row always has its result
        return Replay(result=record.result, state=record.state, operation_id=operation_id)
    if record.lease_valid(now):
        assert record.lease_expires_at is not None
        return InProgress(operation_id=operation_id, lease_expires_at=record.lease_expires_at)

    demotion = None
    kind = ClaimKind.FROM_UNKNOWN
    if record.state is OperationState.IN_PROGRESS:
        kind = ClaimKind.DEMOTE_STALE
        demotion = Observation(
            reservation=record.reservation, kind=ObservationKind.UNKNOWN, source=Source.CLAIM
        )
    claimed = msgspec.structs.replace(
        record,
        state=OperationState.IN_PROGRESS,
        revision=record.revision + 1,
        fencing_token=record.fencing_token + 1,
        lease_expires_at=request.lease_expires_at,
    )
    return Claim(kind=kind, record=claimed, expected_revision=record.revision, demotion=demotion)


def attempt_answer(
    record: Record, *, stored_by_attempt: bool, epoch: int | None = None
) -> AttemptAnswer:
    """What an attempt answers from the row after it settled, gave up or lost its lease. Pure.

    ``stored_by_attempt``: this attempt's own settlement applied the row's terminal outcome.
    ``epoch``: the attempt's binding generation; a row of a later one was superseded while
    the attempt ran (first match: whatever the new epoch holds is not this attempt's).
    """
    operation_id = record.reservation.operation_id
    if epoch is not None and record.reservation.binding_generation > epoch:
        return Superseded(
            operation_id=operation_id,
            binding_generation=record.reservation.binding_generation,
            state=record.state,
        )
    if record.state is OperationState.CONFLICT:
        return OperationConflict(operation_id=operation_id)
    if record.state.terminal:
        assert record.result is not None  # a completed or failed row always has its result
        return Replay(
            result=record.result,
            state=record.state,
            operation_id=operation_id,
            replayed=not stored_by_attempt,
        )
    return Unsettled(
        operation_id=operation_id, state=record.state, lease_expires_at=record.lease_expires_at
    )
