"""The pure settlement core: no I/O, no clock. Frozen Structs in, a Decision out.

``settle`` merges one observation into the authoritative record (the tuple-gated
three-stage merge); ``decide_claim`` decides what a client request does with its row.
"""

from service.core.claim import (
    BindingMismatch,
    Claim,
    ClaimDecision,
    ClaimKind,
    ClaimRequest,
    FingerprintMismatch,
    InProgress,
    OperationConflict,
    Replay,
    decide_claim,
)
from service.core.model import (
    Binding,
    ConflictInfo,
    Disposition,
    InvalidObservation,
    ObservationKind,
    OperationState,
    Record,
    ReservationTuple,
    Result,
    Source,
    Stage,
    TerminalPolicy,
)
from service.core.settle import (
    Apply,
    Decision,
    Ignore,
    Observation,
    Quarantine,
    Reason,
    Strengthen,
    settle,
)

__all__ = [
    "Apply",
    "Binding",
    "BindingMismatch",
    "Claim",
    "ClaimDecision",
    "ClaimKind",
    "ClaimRequest",
    "ConflictInfo",
    "Decision",
    "Disposition",
    "FingerprintMismatch",
    "Ignore",
    "InProgress",
    "InvalidObservation",
    "Observation",
    "ObservationKind",
    "OperationConflict",
    "OperationState",
    "Quarantine",
    "Reason",
    "Record",
    "Replay",
    "ReservationTuple",
    "Result",
    "Source",
    "Stage",
    "Strengthen",
    "TerminalPolicy",
    "decide_claim",
    "settle",
]
