"""The positional arguments of the hot path's statements (:mod:`service.store.hot_sql`), in
the order of their ``$n`` placeholders: the row a CAS or an insert writes, and the
observation recorded with it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from service.core import Apply, Observation, Record
from service.store.rows import record_values, to_ts

__all__ = ["finish_args", "observation_args", "written_args"]


def written_args(values: dict[str, Any]) -> tuple[Any, ...]:
    """The row's reservation, binding, state, revision and fencing token, as both the
    finishing CAS and the one-statement insert write them."""
    return (
        values["binding_generation"],
        values["request_fingerprint"],
        values["bound_principal_id"],
        values["bound_credential_generation"],
        values["state"],
        values["revision"],
        values["fencing_token"],
    )


def finish_args(before: Record, after: Record, decision: Apply, now: datetime) -> tuple[Any, ...]:
    """The finishing CAS: the row as read ($1-$4), as written ($5-$19)."""
    values = record_values(after)
    return (
        uuid.UUID(before.reservation.operation_id),
        before.reservation.request_fingerprint,
        before.reservation.binding_generation,
        decision.expected_revision,
        *written_args(values),
        values["lease_expires_at"],
        values["result_status"],
        values["result_content_type"],
        values["result_body"],
        values["result_digest"],
        values["conflict"],
        now,
    )


def observation_args(observation: Observation, decision: Apply) -> tuple[Any, ...]:
    """The observation row: what was reported and what the core decided of it."""
    result = observation.result
    return (
        observation.source.value,
        observation.kind.value,
        observation.reservation.binding_generation,
        observation.reservation.request_fingerprint,
        observation.fencing_token,
        observation.verified,
        result.status if result else None,
        result.digest if result else None,
        to_ts(observation.lease_expires_at),
        decision.stage.value,
        decision.disposition.value,
        decision.reason.value,
    )
