"""Evidence intake: observers deliver signed evidence of outcomes (``POST /v1/observations``).

The signature is checked first (constant time); the reservation tuple is taken only from
verified evidence. Evidence that does not verify is recorded as a quarantined observation
without touching (or locking) the operation row; evidence about an operation that does not
exist, is another tenant's, or is not an external effect is recorded and refused as not found.
"""

from __future__ import annotations

import uuid

import msgspec

from service.app.answers import Problem
from service.core import Source
from service.evidence import SignedEvidence, observation_of, verify
from service.store.principals import Principal
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
        self, store: SettlementStore, *, secret: str | None, external_routes: frozenset[str]
    ) -> None:
        self._store = store
        self._secret = secret
        self._external_routes = external_routes

    async def deliver(self, observer: Principal, signed: SignedEvidence) -> Accepted | Problem:
        verified = self._secret is not None and verify(signed, self._secret)
        operation_id = signed.evidence.operation_id
        observation = observation_of(signed.evidence, Source.EVIDENCE, verified=verified)
        detail = {"principal_id": str(observer.id)}
        if not verified:
            await self._store.record_refused(
                operation_id, observation, "unverified-evidence", detail
            )
            return Problem(
                "invalid-evidence",
                "the evidence signature does not verify; recorded as quarantined",
            )
        owner = await self._store.owner_of(operation_id)
        if (
            owner is None
            or not observer.may_act_in(owner[0])
            or owner[1] not in self._external_routes  # evidence speaks only of external effects
        ):
            await self._store.record_refused(operation_id, observation, "unknown-operation", detail)
            return Problem("not-found", f"no operation {operation_id} with external evidence")
        try:
            settled = await self._store.settle(operation_id, observation, detail=detail)
        except OperationNotFound:
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
