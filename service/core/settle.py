"""The tuple-gated three-stage merge: ``settle(record, observation, now) -> Decision``.

Rules (docs/design.md §4), applied in this order to one observation against the locked row:

Stage A, tuple gate (every kind)
    A1. unverified evidence, or a reservation tuple other than the record's
        -> Quarantine. The row is untouched; a quarantined stale success never blocks
        a later exact match.
    A2. a fencing token that is not the record's current one (a stale worker)
        -> Ignore. Whatever the stale worker tried to commit is refused.

Stage B, non-terminal rank merge (record and observation both non-terminal)
    rank(unknown) = 0 < rank(in_progress with a valid lease) = 1.
    An in_progress whose lease has expired ranks as unknown: a dead worker is never
    resurrected. The current attempt reporting ``unknown`` ends its own lease first
    (an attempt that says "I am done, outcome unknown" is no longer live).
        observation rank > record rank            -> Apply in_progress (the observation's lease)
        equal rank 1, the holder extends its lease -> Apply (later lease expiry)
        equal rank 0, row still says in_progress   -> Apply unknown (demote the dead lease)
        otherwise                                  -> Ignore (lower or equal rank)

Stage C, terminal resolver (record or observation terminal)
    non-terminal observation after a terminal row           -> Ignore
    terminal observation, non-terminal row                  -> Apply it (any arrival order)
    same kind, same digest                                  -> Strengthen (no change)
    same kind, different digest                             -> Apply conflict
    completed vs failed                                     -> Apply conflict (policy CONFLICT)
        under policy COMPLETED_WINS: completed replaces failed; failed after completed ignored
    row in conflict: a digest already seen -> Strengthen; a new digest -> Apply conflict (+digest)
    row resolved from a conflict (it keeps the conflict's digests): another digest of that
        conflict -> Ignore (the operator already chose)

Resolution (an operator's ``completed`` or ``failed``, ``Observation.resolution``), after stage A
    row in_progress with a valid lease         -> Ignore (the live attempt settles it)
    row unknown, or in_progress past its lease -> Apply it (as stage C would)
    row completed or failed: same kind and digest -> Strengthen; otherwise -> Ignore (a
        terminal outcome is never overwritten by an operator)
    row in conflict: a kind that is among the conflicting ones -> Apply it, keeping the
        conflict's digests (the row is resolved); another kind -> Ignore

Every Apply bumps the revision by one; the shell writes it with a CAS on tuple + old revision.
"""

from __future__ import annotations

import enum

import msgspec

from service.core.model import (
    ConflictInfo,
    Disposition,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    Result,
    Stage,
    TerminalPolicy,
)

__all__ = [
    "Apply",
    "Decision",
    "Ignore",
    "Quarantine",
    "Reason",
    "Strengthen",
    "settle",
]


class Reason(enum.StrEnum):
    """Why the core decided what it did (logged and stored beside the disposition)."""

    TUPLE_MISMATCH = "tuple-mismatch"
    UNVERIFIED = "unverified-evidence"
    STALE_FENCING_TOKEN = "stale-fencing-token"
    RANK_RAISED = "rank-raised"
    LEASE_EXTENDED = "lease-extended"
    LEASE_ENDED = "lease-ended"
    LOWER_OR_EQUAL_RANK = "lower-or-equal-rank"
    AFTER_TERMINAL = "non-terminal-after-terminal"
    TERMINAL_APPLIED = "terminal-applied"
    SAME_DIGEST = "same-digest"
    DIFFERENT_DIGEST = "different-digest"
    COMPLETED_VS_FAILED = "completed-vs-failed"
    COMPLETED_WINS = "completed-wins"
    FAILED_AFTER_COMPLETED = "failed-after-completed"
    ALREADY_RESOLVED = "conflict-already-resolved"
    ATTEMPT_LIVE = "attempt-live"
    TERMINAL_KEPT = "terminal-not-overwritten"
    CONFLICT_RESOLVED = "conflict-resolved"
    NOT_A_CONFLICTING_KIND = "not-a-conflicting-outcome"


class Apply(msgspec.Struct, frozen=True, tag="apply"):
    """Write ``record`` (revision already bumped) with a CAS on ``expected_revision``."""

    record: Record
    expected_revision: int
    stage: Stage
    reason: Reason
    disposition: Disposition = Disposition.APPLIED


class Strengthen(msgspec.Struct, frozen=True, tag="strengthen"):
    """The observation confirms what the row already says; nothing to write on the row."""

    stage: Stage
    reason: Reason
    disposition: Disposition = Disposition.STRENGTHENED


class Ignore(msgspec.Struct, frozen=True, tag="ignore"):
    """The observation loses the merge; the row is untouched."""

    stage: Stage
    reason: Reason
    disposition: Disposition = Disposition.IGNORED


class Quarantine(msgspec.Struct, frozen=True, tag="quarantine"):
    """The observation is not about this reservation epoch; kept aside, row untouched."""

    reason: Reason
    stage: Stage = Stage.TUPLE_GATE
    disposition: Disposition = Disposition.QUARANTINED


Decision = Apply | Strengthen | Ignore | Quarantine


def settle(
    record: Record,
    observation: Observation,
    now: float,
    policy: TerminalPolicy = TerminalPolicy.CONFLICT,
) -> Decision:
    """Merge one observation into the authoritative record. Pure: same inputs, same answer."""
    gate = _tuple_gate(record, observation)
    if gate is not None:
        return gate
    if observation.resolution:
        return _resolve(record, observation, now)
    if record.state.terminal or observation.kind.terminal:
        return _terminal_resolver(record, observation, policy)
    return _rank_merge(record, observation, now)


def _tuple_gate(record: Record, observation: Observation) -> Decision | None:
    if not observation.verified:
        return Quarantine(reason=Reason.UNVERIFIED)
    if observation.reservation != record.reservation:
        return Quarantine(reason=Reason.TUPLE_MISMATCH)
    if observation.fencing_token is not None and observation.fencing_token != record.fencing_token:
        return Ignore(stage=Stage.TUPLE_GATE, reason=Reason.STALE_FENCING_TOKEN)
    return None


def _rank_merge(record: Record, observation: Observation, now: float) -> Decision:
    holder = observation.fencing_token is not None
    record_live = record.lease_valid(now)
    if holder and observation.kind is ObservationKind.UNKNOWN:
        record_live = False
    observed_live = observation.kind is ObservationKind.IN_PROGRESS and (
        observation.lease_expires_at is not None and observation.lease_expires_at > now
    )

    if observed_live and not record_live:
        return _apply(
            record,
            Stage.RANK_MERGE,
            Reason.RANK_RAISED,
            state=OperationState.IN_PROGRESS,
            lease_expires_at=observation.lease_expires_at,
        )
    if observed_live and holder and _later(observation.lease_expires_at, record.lease_expires_at):
        return _apply(
            record,
            Stage.RANK_MERGE,
            Reason.LEASE_EXTENDED,
            lease_expires_at=observation.lease_expires_at,
        )
    if not observed_live and not record_live and record.state is OperationState.IN_PROGRESS:
        return _apply(
            record,
            Stage.RANK_MERGE,
            Reason.LEASE_ENDED,
            state=OperationState.UNKNOWN,
            lease_expires_at=None,
        )
    return Ignore(stage=Stage.RANK_MERGE, reason=Reason.LOWER_OR_EQUAL_RANK)


def _later(candidate: float | None, current: float | None) -> bool:
    return candidate is not None and (current is None or candidate > current)


def _terminal_resolver(
    record: Record, observation: Observation, policy: TerminalPolicy
) -> Decision:
    if not observation.kind.terminal:
        return Ignore(stage=Stage.TERMINAL, reason=Reason.AFTER_TERMINAL)
    result = observation.result
    assert result is not None  # guaranteed by Observation.__post_init__
    observed = OperationState(observation.kind.value)

    if not record.state.terminal:
        return _apply(
            record,
            Stage.TERMINAL,
            Reason.TERMINAL_APPLIED,
            state=observed,
            result=result,
            lease_expires_at=None,
        )
    if record.state is OperationState.CONFLICT:
        return _extend_conflict(record, observation.kind, result)

    stored = record.result
    assert stored is not None  # a completed or failed row always has its result
    if record.state is observed and stored.digest == result.digest:
        return Strengthen(stage=Stage.TERMINAL, reason=Reason.SAME_DIGEST)
    if record.conflict is not None and result.digest in record.conflict.digests:
        return Ignore(stage=Stage.TERMINAL, reason=Reason.ALREADY_RESOLVED)
    if record.state is observed:
        return _conflict(record, observation.kind, result, Reason.DIFFERENT_DIGEST)

    if policy is TerminalPolicy.COMPLETED_WINS:
        if observed is OperationState.COMPLETED:
            return _apply(
                record, Stage.TERMINAL, Reason.COMPLETED_WINS, state=observed, result=result
            )
        return Ignore(stage=Stage.TERMINAL, reason=Reason.FAILED_AFTER_COMPLETED)
    return _conflict(record, observation.kind, result, Reason.COMPLETED_VS_FAILED)


def _resolve(record: Record, observation: Observation, now: float) -> Decision:
    result = observation.result
    assert result is not None  # guaranteed by Observation.__post_init__
    if record.lease_valid(now):
        return Ignore(stage=Stage.RANK_MERGE, reason=Reason.ATTEMPT_LIVE)
    observed = OperationState(observation.kind.value)
    if not record.state.terminal:
        return _apply(
            record,
            Stage.TERMINAL,
            Reason.TERMINAL_APPLIED,
            state=observed,
            result=result,
            lease_expires_at=None,
        )
    if record.state is not OperationState.CONFLICT:
        stored = record.result
        assert stored is not None  # a completed or failed row always has its result
        if record.state is observed and stored.digest == result.digest:
            return Strengthen(stage=Stage.TERMINAL, reason=Reason.SAME_DIGEST)
        return Ignore(stage=Stage.TERMINAL, reason=Reason.TERMINAL_KEPT)
    info = record.conflict
    assert info is not None  # a conflict row always records what conflicted
    if observation.kind not in info.kinds:
        return Ignore(stage=Stage.TERMINAL, reason=Reason.NOT_A_CONFLICTING_KIND)
    return _apply(record, Stage.TERMINAL, Reason.CONFLICT_RESOLVED, state=observed, result=result)


def _conflict(record: Record, kind: ObservationKind, result: Result, reason: Reason) -> Apply:
    stored = record.result
    assert stored is not None
    first_kind = ObservationKind(record.state.value)
    info = ConflictInfo(digests=(stored.digest, result.digest), kinds=(first_kind, kind))
    return _apply(
        record,
        Stage.TERMINAL,
        reason,
        disposition=Disposition.CONFLICT,
        state=OperationState.CONFLICT,
        conflict=info,
    )


def _extend_conflict(record: Record, kind: ObservationKind, result: Result) -> Decision:
    info = record.conflict
    assert info is not None  # a conflict row always records what conflicted
    if result.digest in info.digests:
        return Strengthen(stage=Stage.TERMINAL, reason=Reason.SAME_DIGEST)
    grown = ConflictInfo(digests=(*info.digests, result.digest), kinds=(*info.kinds, kind))
    return _apply(
        record,
        Stage.TERMINAL,
        Reason.DIFFERENT_DIGEST,
        disposition=Disposition.CONFLICT,
        conflict=grown,
    )


def _apply(
    record: Record,
    stage: Stage,
    reason: Reason,
    disposition: Disposition = Disposition.APPLIED,
    **changes: object,
) -> Apply:
    updated = msgspec.structs.replace(record, revision=record.revision + 1, **changes)
    return Apply(
        record=updated,
        expected_revision=record.revision,
        stage=stage,
        reason=reason,
        disposition=disposition,
    )
