"""The values the settlement core reasons about: frozen msgspec Structs, no behaviour.

Times are plain floats (seconds since the epoch) handed in by the shell: the core has no clock.
"""

from __future__ import annotations

import enum

import msgspec

__all__ = [
    "Binding",
    "ConflictInfo",
    "Disposition",
    "InvalidObservation",
    "ObservationKind",
    "OperationState",
    "Record",
    "ReservationTuple",
    "Result",
    "Source",
    "Stage",
    "TerminalPolicy",
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


class InvalidObservation(ValueError):
    """An observation that is malformed on its face (a bug in the caller, not bad luck)."""

    status_hint = 500


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

    tuple: ReservationTuple
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
