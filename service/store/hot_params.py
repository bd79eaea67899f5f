"""The named parameters of the hot path's settling statements (:mod:`service.store.hot_sql`):
the row a CAS or an insert writes, and the observation recorded with it. Names, not
positions: :class:`service.store.hot_sql.Prepared` puts them in the compiled order."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from service.core import Apply, Decision, Observation, Record, Scope
from service.store.rows import observation_values, record_values, to_ts

__all__ = ["claim_settle_params", "finish_params", "recorded_params", "scope_params"]


def scope_params(scope: Scope) -> dict[str, Any]:
    """The scope's columns, by name."""
    return {
        "tenant": scope.tenant,
        "principal_id": scope.principal_id,
        "route": scope.route,
        "idempotency_key": scope.idempotency_key,
    }


def _observed(observation: Observation, decision: Decision) -> dict[str, Any]:
    """The observation row (``o_<column>``): what was reported, what the core decided of it."""
    values = {f"o_{name}": value for name, value in observation_values(observation).items()}
    values.update(
        o_stage=decision.stage.value,
        o_disposition=decision.disposition.value,
        o_reason=decision.reason.value,
    )
    return values


def finish_params(
    tenant: str,
    before: Record,
    decision: Apply,
    observation: Observation,
    attempt_id: uuid.UUID,
    now: datetime,
    expires: datetime | None,
) -> dict[str, Any]:
    """The finishing CAS (the row of ``tenant`` as read, as written), the observation, the
    attempt's end; ``expires``: the row's new ``expires_at`` (None keeps it)."""
    reservation = before.reservation
    return {
        "tenant": tenant,
        "id": uuid.UUID(reservation.operation_id),
        "expected_fingerprint": reservation.request_fingerprint,
        "expected_generation": reservation.binding_generation,
        **record_values(decision.record),
        **_observed(observation, decision),
        "expected_revision": decision.expected_revision,
        "expires_at": expires,
        "now": now,
        "attempt_id": attempt_id,
    }


def claim_settle_params(
    scope: Scope,
    claimed: Record,
    decision: Apply,
    observation: Observation,
    attempt_id: uuid.UUID,
    lease_token: str | None,
    now: datetime,
    expires: datetime | None,
    canonical_request: str | None = None,
) -> dict[str, Any]:
    """A new row as the core settled it (``canonical_request``: what its fingerprint
    covers), its attempt (begun as ``claimed``, ended now) and the observation."""
    return {
        "id": uuid.UUID(claimed.reservation.operation_id),
        **scope_params(scope),
        **record_values(decision.record),
        "canonical_request": canonical_request,
        **_observed(observation, decision),
        "expected_revision": decision.expected_revision,
        "expires_at": expires,
        "now": now,
        "attempt_id": attempt_id,
        "lease_token": lease_token,
        "attempt_fencing_token": claimed.fencing_token,
        "attempt_generation": claimed.reservation.binding_generation,
        "attempt_lease_expires_at": to_ts(claimed.lease_expires_at),
    }


def recorded_params(
    tenant: str,
    record: Record,
    decision: Decision,
    observation: Observation,
    attempt_id: uuid.UUID,
    now: datetime,
) -> dict[str, Any]:
    """An observation the core did not apply (the row of ``tenant`` stays at ``record``'s
    revision), and the attempt's end with the decision's reason."""
    return {
        "tenant": tenant,
        "id": uuid.UUID(record.reservation.operation_id),
        "revision": record.revision,
        **_observed(observation, decision),
        "now": now,
        "attempt_id": attempt_id,
    }
