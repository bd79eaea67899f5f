"""The settle phase: one observation merged into its operation's row.

Lock the row, ask the core (``settle``: tuple gate, rank merge, terminal resolver), write
with the tuple + revision CAS when it applies, and record the observation with the stage and
disposition that decided it, in the same transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from service.core import Apply, Decision, Observation, Record, Source, TerminalPolicy, settle
from service.store.outcomes import Settled
from service.store.phase import Phase
from service.store.retention import Retention
from service.store.rows import at
from service.store.unit_of_work import AttemptEnd, UnitOfWork

__all__ = ["settle_phase"]


def settle_phase(
    operation_id: uuid.UUID,
    observation: Observation,
    *,
    tenant: str | None = None,
    attempt_id: uuid.UUID | None,
    detail: dict[str, Any] | None,
    clock: Callable[[], float],
    policy: TerminalPolicy,
    retention: Retention,
) -> Phase[tuple[Record, Settled] | None]:
    """The phase returns the row as it was and the settlement, or None: no such operation.
    ``tenant``: the operation's, when the caller knows it (else found from its id)."""

    async def phase(uow: UnitOfWork) -> tuple[Record, Settled] | None:
        uow.tenant = tenant or uow.tenant
        found = await uow.get_for_update_with_scope(operation_id)
        if found is None:
            return None
        scope, record = found
        now = clock()
        decision = settle(record, observation, now, policy)
        after = record
        if isinstance(decision, Apply):
            after = decision.record
            expiry: dict[str, Any] = {}
            if after.state.terminal and not record.state.terminal:
                # a row that becomes terminal starts its retention clock
                expiry["expires_at"] = at(now) + timedelta(seconds=retention.of(scope.route))
            await uow.cas_write(after, decision.expected_revision, at(now), **expiry)
        finish = None
        if attempt_id is not None and observation.source is Source.ATTEMPT:
            finish = AttemptEnd(
                attempt_id=attempt_id,
                outcome=observation.kind.value,
                status=observation.result.status if observation.result else None,
                error=_attempt_error(decision, detail),
                at=at(now),
            )
        observation_id = await uow.record_decision(
            operation_id,
            observation,
            decision,
            record.revision,
            attempt_id=attempt_id,
            detail=detail,
            finish_attempt=finish,
            tenant=scope.tenant,
        )
        settled = Settled(
            decision=decision, record=after, observation=observation, observation_id=observation_id
        )
        return record, settled

    return phase


def _attempt_error(decision: Decision, detail: dict[str, Any] | None) -> str | None:
    """The attempt's error: what it says went wrong (``detail["error"]``, e.g. "provider
    answered 503"), and the core's reason when it did not apply what the attempt reported."""
    said = None if detail is None else detail.get("error")
    if isinstance(decision, Apply):
        return None if said is None else str(said)
    reason = decision.reason.value
    return reason if said is None else f"{said} (not applied: {reason})"
