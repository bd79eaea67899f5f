"""The claim phase: a new attempt takes the scope's operation, or learns why not.

Lock the scope's row (or insert it), ask the core (``decide_claim``), CAS, and record the
attempt; a stale ``in_progress`` row's demotion is recorded as an observation in the same
transaction. An insert under a live tombstone is refused by the schema itself (migration 0006):
the phase runner raises it as :class:`~service.store.outcomes.KeyExpired`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from service.core import (
    Claim,
    ClaimKind,
    ClaimRequest,
    Scope,
    TerminalPolicy,
    decide_claim,
    settle,
    with_lease,
)
from service.store.outcomes import ClaimOutcome
from service.store.phase import Phase
from service.store.rows import at
from service.store.unit_of_work import StaleRevision, UnitOfWork

__all__ = ["claim_phase"]


def claim_phase(
    scope: Scope,
    request: ClaimRequest,
    *,
    lease_token: str | None,
    holds_lease: bool,
    clock: Callable[[], float],
    policy: TerminalPolicy,
) -> Phase[ClaimOutcome]:
    """A NEW claim's insert does nothing if another claimer inserted first; the rerun then
    locks that row."""

    async def phase(uow: UnitOfWork) -> ClaimOutcome:
        record = await uow.get_for_update_by_scope(scope)
        now = clock()
        if record is not None and holds_lease:
            record = with_lease(record, None, now)
        decision = decide_claim(record, request, now)
        if not isinstance(decision, Claim):
            return ClaimOutcome(decision=decision, record=record)
        claimed = decision.record
        attempt_id = uuid.uuid4()
        stamp = at(now)
        if decision.kind is ClaimKind.NEW:
            if not await uow.insert_operation(
                scope,
                claimed,
                stamp,
                current_attempt_id=attempt_id,
                canonical_request=request.canonical_request,
            ):
                raise StaleRevision(f"scope of {scope.route}: inserted by another claimer")
        else:
            assert record is not None and decision.expected_revision is not None
            await uow.cas_write(
                claimed, decision.expected_revision, stamp, current_attempt_id=attempt_id
            )
            if decision.demotion is not None:
                # The demotion and the claim are one write (r -> r + 1, in_progress under the
                # new token): the audit row says so, rather than name an "unknown" revision
                # the row never had.
                demoted = settle(record, decision.demotion, now, policy)
                await uow.record_observation(
                    uuid.UUID(claimed.reservation.operation_id),
                    decision.demotion,
                    stage=demoted.stage.value,
                    disposition=demoted.disposition.value,
                    reason=demoted.reason.value,
                    revision_before=record.revision,
                    revision_after=claimed.revision,
                    attempt_id=attempt_id,
                    tenant=scope.tenant,
                    detail={
                        "written_with_claim": True,
                        "state_after": claimed.state.value,
                        "fencing_token_after": claimed.fencing_token,
                    },
                )
        await uow.insert_attempt(attempt_id, claimed, lease_token, stamp, tenant=scope.tenant)
        return ClaimOutcome(decision=decision, record=claimed, attempt_id=attempt_id)

    return phase
