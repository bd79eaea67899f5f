"""What a use case answers, as data: HTTP renders it and decides nothing.

* :class:`Stored`: an outcome stored on the operation row (a replay, or this attempt's own);
* :class:`Problem`: a refusal named by its problem slug (the HTTP layer maps slugs to
  statuses in one table), with the operation it is about and whether to retry.

:func:`answer_of` turns every decision of the core that is answered rather than executed
into one of them; it is the one ``match`` over those decisions.
"""

from __future__ import annotations

from urllib.parse import urlencode

import msgspec

from service.core import (
    AttemptAnswer,
    BindingMismatch,
    Claim,
    ClaimDecision,
    FingerprintMismatch,
    InProgress,
    OperationConflict,
    Replay,
    Result,
    Scope,
    Superseded,
    Unsettled,
)
from service.store.retention import Tombstone

__all__ = [
    "Answer",
    "Problem",
    "ProblemDocument",
    "Stored",
    "answer_of",
    "busy",
    "expired",
    "with_preference",
]


class Stored(msgspec.Struct, frozen=True):
    """Answer with the stored result; ``replayed`` unless this attempt stored it."""

    result: Result
    operation_id: str
    replayed: bool
    preference_applied: str | None = None


class Problem(msgspec.Struct, frozen=True):
    """A refusal: its slug, what happened, and what it is about."""

    slug: str
    detail: str
    operation_id: str | None = None
    state: str | None = None
    retry_after: bool = False
    retry_after_seconds: int | None = None  # Retry-After's value when it is not 1
    location: str | None = None
    preference_applied: str | None = None
    expired_at: str | None = None
    forget_at: str | None = None


Answer = Stored | Problem


class ProblemDocument(msgspec.Struct, omit_defaults=True):
    """An RFC 9457 problem+json body (answered, and stored for business failures)."""

    type: str
    title: str
    status: int
    detail: str
    operation_id: str | None = None
    state: str | None = None
    # a tombstoned operation (410): when it expired, and when its key is new again
    expired_at: str | None = None
    forget_at: str | None = None


def expired(tombstone: Tombstone) -> Problem:
    """410: the operation was purged by retention; what its tombstone keeps."""
    return Problem(
        "idempotency-key-expired",
        "this operation's result expired and was purged; its key cannot run anything until "
        "forget_at, when it is new again",
        str(tombstone.operation_id),
        state=tombstone.final_state,
        expired_at=tombstone.expired_at.isoformat(),
        forget_at=tombstone.forget_at.isoformat(),
    )


def answer_of(decision: ClaimDecision | AttemptAnswer) -> Answer:
    """The answer to a decision of the core that is answered, not executed."""
    match decision:
        case Replay(result=result, operation_id=op, replayed=replayed):
            return Stored(result=result, operation_id=op, replayed=replayed)
        case FingerprintMismatch(operation_id=op):
            return Problem("fingerprint-mismatch", "this key was used with a different request", op)
        case BindingMismatch(operation_id=op):
            return Problem(
                "binding-mismatch",
                "the operation is bound to another credential generation; "
                "an admin supersede is needed",
                op,
            )
        case OperationConflict(operation_id=op):
            return Problem(
                "operation-conflict",
                "incompatible outcomes were observed; see the status resource",
                op,
                state="conflict",
            )
        case Superseded(operation_id=op, binding_generation=epoch, state=state):
            return Problem(
                "operation-superseded",
                f"an admin started epoch {epoch} of this operation while this attempt ran; "
                "what this attempt saw is kept as an observation of its own epoch. Retry "
                "with the same key to run (or replay) the new epoch",
                op,
                state=state.value,
            )
        case InProgress(operation_id=op) | Unsettled(operation_id=op):
            return Problem(
                "operation-in-progress",
                "another attempt holds this operation's lease",
                op,
                state="in_progress",
                retry_after=True,
                location=f"/v1/operations/{op}",
            )
        case Claim():  # pragma: no cover - claims are executed, never answered
            raise AssertionError("a claim is executed, not answered")


def busy(scope: Scope) -> Problem:
    """409 for a scope whose operation id is not known here: point at the key lookup."""
    location = "/v1/operations?" + urlencode({"key": scope.idempotency_key, "route": scope.route})
    return Problem(
        "operation-in-progress",
        "another attempt holds this operation",
        state="in_progress",
        retry_after=True,
        location=location,
    )


def with_preference(answer: Answer, applied: str) -> Answer:
    return msgspec.structs.replace(answer, preference_applied=applied)
