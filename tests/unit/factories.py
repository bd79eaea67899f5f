"""Factories for the core's values: one sensible default per field, every field overridable.

Times are fixed around ``NOW`` so that "valid" and "expired" leases mean the same thing in
every test. ``make_record`` fills what a row in a given state always carries (a result for
``completed``/``failed``, a result and the conflicting digests for ``conflict``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from service.core import (
    Apply,
    Binding,
    ClaimRequest,
    ConflictInfo,
    Decision,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    ReservationTuple,
    Result,
    Source,
)

NOW = 1_000_000.0
LEASE_TTL = 10.0
RECORD_LEASE = NOW + LEASE_TTL
"""The row's lease: still valid at ``NOW``."""
OBSERVED_LEASE = NOW + 2 * LEASE_TTL
"""A fresh lease reported by an observation: valid at ``NOW`` and later than the row's."""
REQUEST_LEASE = NOW + 3 * LEASE_TTL
"""The lease a claiming request holds."""
EXPIRED_LEASE = NOW - LEASE_TTL

OPERATION_ID = "op-1"
FINGERPRINT = "fp-1"
BINDING_GENERATION = 1
PRINCIPAL_ID = "principal-1"
CREDENTIAL_GENERATION = 1
REVISION = 7
FENCING_TOKEN = 3
STALE_FENCING_TOKEN = FENCING_TOKEN - 1

STORED_DIGEST = "d1"
"""The digest a terminal row stores (and the first digest of a conflict row)."""
SEEN_DIGEST = "d2"
"""The second digest a conflict row has already seen."""
NEW_DIGEST = "d3"
"""A digest no row has seen."""
SUCCESS_STATUS = 201
FAILURE_STATUS = 402

LeaseSpec = Literal["valid", "expired", "default"] | float | None
MismatchField = Literal["operation_id", "request_fingerprint", "binding_generation"]

_MISMATCHED_VALUES: dict[str, object] = {
    "operation_id": "op-other",
    "request_fingerprint": "fp-other",
    "binding_generation": BINDING_GENERATION + 1,
}


def make_tuple(**overrides: Any) -> ReservationTuple:
    fields: dict[str, Any] = {
        "operation_id": OPERATION_ID,
        "request_fingerprint": FINGERPRINT,
        "binding_generation": BINDING_GENERATION,
    }
    fields.update(overrides)
    return ReservationTuple(**fields)


def make_binding(**overrides: Any) -> Binding:
    fields: dict[str, Any] = {
        "principal_id": PRINCIPAL_ID,
        "credential_generation": CREDENTIAL_GENERATION,
    }
    fields.update(overrides)
    return Binding(**fields)


def make_result(
    digest: str = STORED_DIGEST, status: int = SUCCESS_STATUS, **overrides: Any
) -> Result:
    fields: dict[str, Any] = {
        "status": status,
        "content_type": "application/json",
        "body": f'{{"digest": "{digest}", "status": {status}}}'.encode(),
        "digest": digest,
    }
    fields.update(overrides)
    return Result(**fields)


def make_conflict(
    digests: tuple[str, ...] = (STORED_DIGEST, SEEN_DIGEST),
    kinds: tuple[ObservationKind | str, ...] | None = None,
) -> ConflictInfo:
    if kinds is None:
        kinds = (ObservationKind.COMPLETED,) * len(digests)
    return ConflictInfo(digests=digests, kinds=tuple(ObservationKind(kind) for kind in kinds))


def make_record(
    state: OperationState | str = "unknown",
    lease: LeaseSpec = "default",
    **overrides: Any,
) -> Record:
    """A row in ``state``.

    ``lease``: "valid" (``RECORD_LEASE``), "expired", None (no lease known) or an exact time;
    by default "valid" for an ``in_progress`` row and None otherwise.
    """
    row_state = OperationState(state)
    if lease == "default":
        lease = "valid" if row_state is OperationState.IN_PROGRESS else None
    fields: dict[str, Any] = {
        "reservation": make_tuple(),
        "binding": make_binding(),
        "state": row_state,
        "revision": REVISION,
        "fencing_token": FENCING_TOKEN,
        "lease_expires_at": _lease_time(lease, valid=RECORD_LEASE),
        "result": _default_stored_result(row_state),
        "conflict": make_conflict() if row_state is OperationState.CONFLICT else None,
    }
    fields.update(overrides)
    return Record(**fields)


def make_observation(
    kind: ObservationKind | str = "unknown",
    tuple_match: bool = True,
    *,
    mismatch: MismatchField = "binding_generation",
    lease: LeaseSpec = "default",
    digest: str = STORED_DIGEST,
    status: int | None = None,
    **overrides: Any,
) -> Observation:
    """An observation of ``kind`` about the default reservation tuple.

    ``tuple_match=False`` changes the ``mismatch`` field of the tuple (another epoch by
    default). A terminal kind carries ``make_result(digest, status)`` (status 201 for
    ``completed``, 402 for ``failed``). ``lease``: "valid" (``OBSERVED_LEASE``), "expired",
    None or an exact time; by default "valid" for ``in_progress`` and None otherwise.
    """
    observed = ObservationKind(kind)
    if lease == "default":
        lease = "valid" if observed is ObservationKind.IN_PROGRESS else None
    reservation = (
        make_tuple() if tuple_match else make_tuple(**{mismatch: _MISMATCHED_VALUES[mismatch]})
    )
    result = None
    if observed.terminal:
        if status is None:
            status = SUCCESS_STATUS if observed is ObservationKind.COMPLETED else FAILURE_STATUS
        result = make_result(digest, status)
    fields: dict[str, Any] = {
        "reservation": reservation,
        "kind": observed,
        "source": Source.ATTEMPT,
        "result": result,
        "lease_expires_at": _lease_time(lease, valid=OBSERVED_LEASE),
        "fencing_token": None,
        "verified": True,
    }
    fields.update(overrides)
    return Observation(**fields)


def make_request(**overrides: Any) -> ClaimRequest:
    fields: dict[str, Any] = {
        "request_fingerprint": FINGERPRINT,
        "binding": make_binding(),
        "new_operation_id": "op-new",
        "lease_expires_at": REQUEST_LEASE,
    }
    fields.update(overrides)
    return ClaimRequest(**fields)


def apply_decision(record: Record, decision: Decision) -> Record:
    """What the shell writes: the new record on Apply, the old one otherwise."""
    if isinstance(decision, Apply):
        return decision.record
    return record


def replace(record: Record, **changes: Any) -> Record:
    return msgspec.structs.replace(record, **changes)


def _lease_time(lease: LeaseSpec, *, valid: float) -> float | None:
    if lease == "valid":
        return valid
    if lease == "expired":
        return EXPIRED_LEASE
    assert not isinstance(lease, str)
    return lease


def _default_stored_result(state: OperationState) -> Result | None:
    if state is OperationState.FAILED:
        return make_result(STORED_DIGEST, FAILURE_STATUS)
    if state.terminal:
        return make_result(STORED_DIGEST, SUCCESS_STATUS)
    return None
