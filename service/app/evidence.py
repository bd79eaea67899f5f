"""Evidence intake: observers deliver signed evidence of outcomes (``POST /v1/observations``).

The rules, in the order they are applied:

1. **The cap.** An observer that had ``quarantine_limit`` of its evidence quarantined
   (refused here, or stopped at the tuple gate) within ``quarantine_window`` is refused with
   ``evidence-quota-exceeded`` (429, ``Retry-After``: until its oldest counted one leaves the
   window); nothing is recorded. One observer cannot fill the tables or an operation's
   history with refused documents.
2. **Whose operation.** Evidence is tied to an operation only when the operation is an
   external effect of the observer's own tenant (an all-tenant principal's: any). Anything
   else (no such operation, another tenant's, a local effect) is one case, so nobody learns
   whether an id exists elsewhere: it is recorded as a quarantined ``unknown-operation``
   observation *without* an operation id, kept only with the sender's principal id, and goes
   with the other orphans after ``SETTLEMENT_ORPHAN_RETENTION``. Nothing of it is listed in
   any operation's history.
3. **The signature** (constant time); the reservation tuple is taken only from verified
   evidence. Unsigned (or wrongly signed) evidence about the observer's own tenant's
   operation is recorded as a quarantined ``unverified-evidence`` observation of that
   operation, without touching (or locking) its row: its owner sees that someone in the
   tenant sends bad documents about it. The cap bounds how many, and the status resource
   always lists the observation that settled the operation. Unsigned evidence about
   anything else is rule 2's orphan. Either way the answer is ``invalid-evidence``, the same
   whether or not the operation exists.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec

from service.app.answers import Problem
from service.core import Source
from service.domain.principals import Principal
from service.evidence import SignedEvidence, observation_of, verify
from service.store.settlement import OperationNotFound, SettlementStore

__all__ = ["Accepted", "EvidenceIntake", "OperationSummary"]


class OperationSummary(msgspec.Struct):
    id: uuid.UUID
    state: str
    revision: int
    binding_generation: int


class Accepted(msgspec.Struct):
    disposition: str
    reason: str
    operation: OperationSummary


class EvidenceIntake:
    def __init__(
        self,
        store: SettlementStore,
        *,
        secret: str | None,
        external_routes: frozenset[str],
        quarantine_limit: int,
        quarantine_window: float,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._secret = secret
        self._external_routes = external_routes
        self._limit = quarantine_limit
        self._window = quarantine_window
        self._clock = clock

    async def deliver(self, observer: Principal, signed: SignedEvidence) -> Accepted | Problem:
        over = await self._over_cap(observer)
        if over is not None:
            return over
        verified = self._secret is not None and verify(signed, self._secret)
        operation_id = signed.evidence.operation_id
        observation = observation_of(signed.evidence, Source.EVIDENCE, verified=verified)
        detail = {"principal_id": str(observer.id)}
        tenant = await self._tenant_of(observer, operation_id)
        if tenant is None:
            await self._store.record_refused(
                None, observation, "unknown-operation", detail, tenant=observer.tenant
            )
            if not verified:
                return _unverified()
            return Problem("not-found", f"no operation {operation_id} with external evidence")
        if not verified:
            await self._store.record_refused(
                operation_id, observation, "unverified-evidence", detail, tenant=tenant
            )
            return _unverified()
        try:
            settled = await self._store.settle(
                operation_id, observation, detail=detail, tenant=tenant
            )
        except OperationNotFound:  # purged since its owner was read: the store kept it as
            # an orphan of that id (under the operation's tenant), gone with the orphans
            return Problem("not-found", f"no operation {operation_id}")
        record = settled.record
        return Accepted(
            disposition=settled.decision.disposition.value,
            reason=settled.decision.reason.value,
            operation=OperationSummary(
                id=operation_id,
                state=record.state.value,
                revision=record.revision,
                binding_generation=record.reservation.binding_generation,
            ),
        )

    async def _tenant_of(self, observer: Principal, operation_id: uuid.UUID) -> str | None:
        """The tenant of an external effect of the observer's tenant (rule 2), read pinned to
        the observer's own; None: not one."""
        own = None if observer.all_tenants else observer.tenant
        owner = await self._store.reads.owner_of(operation_id, own)
        if (
            owner is not None
            and observer.may_act_in(owner[0])
            and owner[1] in self._external_routes  # evidence speaks only of external effects
        ):
            return owner[0]
        return None

    async def _over_cap(self, observer: Principal) -> Problem | None:
        """Rule 1: the problem to answer, or None while the observer is under its cap."""
        now = datetime.fromtimestamp(self._clock(), UTC)
        window = timedelta(seconds=self._window)
        seen = await self._store.reads.quarantined_evidence(
            observer.id,
            now - window,
            self._limit,
            None if observer.all_tenants else observer.tenant,
        )
        if seen.count < self._limit or seen.oldest is None:
            return None
        # until the oldest counted one leaves the window (the database's clock wrote it:
        # never more than the window, never less than a second)
        left = (seen.oldest + window - now).total_seconds()
        wait = max(1, min(math.ceil(self._window), math.ceil(left)))
        return Problem(
            "evidence-quota-exceeded",
            f"{seen.count} of this observer's evidence were quarantined within the last "
            f"{self._window:g} s (the most is {self._limit}); nothing was recorded",
            retry_after=True,
            retry_after_seconds=wait,
        )


def _unverified() -> Problem:
    return Problem(
        "invalid-evidence", "the evidence signature does not verify; recorded as quarantined"
    )
