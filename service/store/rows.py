"""Mapping between operation rows and the core's frozen Records."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from service.core import (
    Binding,
    ConflictInfo,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    ReservationTuple,
    Result,
)

__all__ = ["at", "from_ts", "observation_values", "record_from_row", "record_values", "to_ts"]


def to_ts(seconds: float | None) -> datetime | None:
    return None if seconds is None else at(seconds)


def at(seconds: float) -> datetime:
    """The aware UTC datetime of an epoch-seconds instant."""
    return datetime.fromtimestamp(seconds, UTC)


def from_ts(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def record_from_row(row: Mapping[Any, Any]) -> Record:
    result = None
    if row["result_digest"] is not None:
        result = Result(
            status=row["result_status"],
            content_type=row["result_content_type"],
            body=bytes(row["result_body"]),
            digest=row["result_digest"],
        )
    conflict = None
    if row["conflict"] is not None:
        conflict = ConflictInfo(
            digests=tuple(row["conflict"]["digests"]),
            kinds=tuple(ObservationKind(k) for k in row["conflict"]["kinds"]),
        )
    return Record(
        reservation=ReservationTuple(
            operation_id=str(row["id"]),
            request_fingerprint=row["request_fingerprint"],
            binding_generation=row["binding_generation"],
        ),
        binding=Binding(
            principal_id=str(row["bound_principal_id"]),
            credential_generation=row["bound_credential_generation"],
        ),
        state=OperationState(row["state"]),
        revision=row["revision"],
        fencing_token=row["fencing_token"],
        lease_expires_at=from_ts(row["lease_expires_at"]),
        result=result,
        conflict=conflict,
    )


def record_values(record: Record) -> dict[str, Any]:
    """The operation columns a Record determines (everything but scope and timestamps)."""
    result = record.result
    conflict = record.conflict
    return {
        "binding_generation": record.reservation.binding_generation,
        "request_fingerprint": record.reservation.request_fingerprint,
        "bound_principal_id": uuid.UUID(record.binding.principal_id),
        "bound_credential_generation": record.binding.credential_generation,
        "state": record.state.value,
        "revision": record.revision,
        "fencing_token": record.fencing_token,
        "lease_expires_at": to_ts(record.lease_expires_at),
        "result_status": result.status if result else None,
        "result_content_type": result.content_type if result else None,
        "result_body": result.body if result else None,
        "result_digest": result.digest if result else None,
        "conflict": (
            {"digests": list(conflict.digests), "kinds": [k.value for k in conflict.kinds]}
            if conflict
            else None
        ),
    }


def observation_values(observation: Observation) -> dict[str, Any]:
    """The observation columns an Observation determines: what was reported (the core's
    stage, disposition and reason of it are the decision's)."""
    result = observation.result
    return {
        "source": observation.source.value,
        "kind": observation.kind.value,
        "binding_generation": observation.reservation.binding_generation,
        "request_fingerprint": observation.reservation.request_fingerprint,
        "fencing_token": observation.fencing_token,
        "verified": observation.verified,
        "result_status": result.status if result else None,
        "result_digest": result.digest if result else None,
        "lease_expires_at": to_ts(observation.lease_expires_at),
    }
