"""The values the settlement core reasons about: frozen msgspec Structs, no behaviour.

Times are plain floats (seconds since the epoch) handed in by the shell: the core has no clock.
"""

from __future__ import annotations

import enum
import hashlib
import uuid

import msgspec

from service.errors import SettlementError

__all__ = [
    "Binding",
    "ConflictInfo",
    "Disposition",
    "InvalidObservation",
    "Observation",
    "ObservationKind",
    "OperationState",
    "Record",
    "ReservationTuple",
    "Result",
    "Scope",
    "Source",
    "Stage",
    "TerminalPolicy",
    "with_lease",
]


class OperationState(enum.StrEnum):
    IN_PROGRESS = "in_progress"
    UNKNOWN = "unknown"
    COMPLETED = "completed"
    FAILED = "failed"
    CONFLICT = "conflict"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_STATES


_TERMINAL_STATES = frozenset(
    {OperationState.COMPLETED, OperationState.FAILED, OperationState.CONFLICT}
)


class ObservationKind(enum.StrEnum):
    """What an observation reports. Only these four can be observed; ``conflict`` is derived."""

    IN_PROGRESS = "in_progress"
    UNKNOWN = "unknown"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (ObservationKind.COMPLETED, ObservationKind.FAILED)


class Source(enum.StrEnum):
    """Who reported an observation (kept on the observation row; the merge ignores it)."""

    ATTEMPT = "attempt"
    LATE_RESPONSE = "late_response"
    EVIDENCE = "evidence"
    FEED = "feed"
    SWEEPER = "sweeper"
    CLAIM = "claim"
    ADMIN = "admin"


class Stage(enum.StrEnum):
    """Which stage of the merge decided an observation."""

    TUPLE_GATE = "A"
    RANK_MERGE = "B"
    TERMINAL = "C"


class Disposition(enum.StrEnum):
    APPLIED = "applied"
    STRENGTHENED = "strengthened"
    IGNORED = "ignored"
    QUARANTINED = "quarantined"
    CONFLICT = "conflict"


class TerminalPolicy(enum.StrEnum):
    """How ``completed`` vs ``failed`` under one tuple resolves."""

    CONFLICT = "conflict"
    COMPLETED_WINS = "completed_wins"


class InvalidObservation(SettlementError, ValueError):
    """An observation that is malformed on its face (a bug in the caller, not bad luck)."""

    problem = "internal-error"


class ReservationTuple(msgspec.Struct, frozen=True):
    """Identity of one reservation epoch. Immutable within the epoch."""

    operation_id: str
    request_fingerprint: str
    binding_generation: int


class Binding(msgspec.Struct, frozen=True):
    """The authority a reservation was made under."""

    principal_id: str
    credential_generation: int


class Result(msgspec.Struct, frozen=True):
    """A stored outcome: what a replay sends back, and its digest."""

    status: int
    content_type: str
    body: bytes
    digest: str


class ConflictInfo(msgspec.Struct, frozen=True):
    """The incompatible terminal outcomes seen under one tuple, in arrival order."""

    digests: tuple[str, ...]
    kinds: tuple[ObservationKind, ...]


class Record(msgspec.Struct, frozen=True):
    """The authoritative operation row as the core sees it.

    ``lease_expires_at`` is when the current attempt's lease ends (None: no lease known);
    the shell fills it from what it knows of the lease before asking the core.
    """

    reservation: ReservationTuple
    binding: Binding
    state: OperationState
    revision: int
    fencing_token: int
    lease_expires_at: float | None = None
    result: Result | None = None
    conflict: ConflictInfo | None = None

    def lease_valid(self, now: float) -> bool:
        return (
            self.state is OperationState.IN_PROGRESS
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )


def with_lease(record: Record, remaining: float | None, now: float) -> Record:
    """The one way a lease's liveness reaches the core.

    The lease lives in Redis (heartbeats extend it there, not in the row), so before the core
    decides about an ``in_progress`` row the shell asks the lease store how long the scope's
    lease has left: ``remaining`` seconds, or None when nobody holds it. A caller that holds
    the scope's lease itself passes None: the row's attempt cannot be holding it.
    """
    if record.state is not OperationState.IN_PROGRESS:
        return record
    expires = None if remaining is None else now + remaining
    return msgspec.structs.replace(record, lease_expires_at=expires)


class Scope(msgspec.Struct, frozen=True):
    """What an idempotency key is unique within: (tenant, principal, route, key)."""

    tenant: str
    principal_id: uuid.UUID
    route: str
    idempotency_key: str

    def lease_name(self) -> str:
        """The scope's lease key in Redis: a digest, so any key fits and none collide."""
        raw = f"{self.tenant}\x00{self.principal_id}\x00{self.route}\x00{self.idempotency_key}"
        return hashlib.sha256(raw.encode()).hexdigest()


class Observation(msgspec.Struct, frozen=True):
    """One report about an operation's outcome.

    ``fencing_token`` is set when an attempt reports about itself (its effect is only valid
    while it is the current attempt); None for reports that stand on their own (a provider's
    answer, signed evidence, a feed event, the sweeper).
    ``verified`` is False for evidence whose signature did not verify: always quarantined.
    ``resolution`` is True for an operator's resolution (source ``admin``, a terminal kind):
    it settles only an ``unknown`` row (or one whose lease is gone) or a ``conflict`` row,
    and never overwrites a ``completed`` or ``failed`` one (rules in ``settle.py``).
    """

    reservation: ReservationTuple
    kind: ObservationKind
    source: Source
    result: Result | None = None
    lease_expires_at: float | None = None
    fencing_token: int | None = None
    verified: bool = True
    resolution: bool = False

    def __post_init__(self) -> None:
        if self.resolution and (self.source is not Source.ADMIN or not self.kind.terminal):
            raise InvalidObservation("a resolution is an admin's completed or failed")
        if self.kind.terminal and self.result is None:
            raise InvalidObservation(f"a {self.kind} observation needs a result")
        if not self.kind.terminal and self.result is not None:
            raise InvalidObservation(f"a {self.kind} observation carries no result")
        if self.kind is ObservationKind.IN_PROGRESS and self.lease_expires_at is None:
            raise InvalidObservation("an in_progress observation needs lease_expires_at")
