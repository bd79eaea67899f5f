"""What an attempt knows and says about itself: its reference and context from its claim,
what it observed under its own fencing token, its settlement, and what the row then says.
"""

from __future__ import annotations

import uuid

from service.app.effects import ExecutionContext, Outcome
from service.app.fingerprint import result_digest
from service.app.ports import SettlementPort
from service.core import (
    Apply,
    AttemptAnswer,
    Observation,
    ObservationKind,
    Result,
    Source,
    attempt_answer,
)
from service.domain.payouts import ProviderClient
from service.domain.principals import Principal
from service.store.settlement import AttemptRef, ClaimOutcome, Settled
from service.telemetry import span

__all__ = ["answer_after", "attempt_observation", "attempt_of", "settle_attempt"]


async def settle_attempt(
    store: SettlementPort,
    attempt: AttemptRef,
    observation: Observation,
    error: str | None = None,
    tenant: str | None = None,
) -> Settled:
    """Settle what this attempt observed, in a ``settlement.settle`` span; ``error``: why it
    has no outcome, in an operator's words (kept in the observation's detail and as the
    attempt's error); ``tenant``: the operation's (None: found from its id)."""
    op = attempt.reservation.operation_id
    detail = None if error is None else {"error": error}
    with span("settlement.settle", operation_id=op, attempt_number=attempt.fencing_token) as traced:
        settled = await store.settle(
            uuid.UUID(op), observation, attempt_id=attempt.attempt_id, detail=detail, tenant=tenant
        )
        traced.set(
            settlement_stage=settled.decision.stage.value,
            settlement_disposition=settled.decision.disposition.value,
        )
        return settled


def attempt_observation(
    attempt: AttemptRef,
    kind: ObservationKind = ObservationKind.UNKNOWN,
    produced: Outcome | None = None,
) -> Observation:
    """What this attempt reports about itself, under its own fencing token."""
    result = None
    if produced is not None:
        result = Result(
            status=produced.status,
            content_type=produced.content_type,
            body=produced.body,
            digest=result_digest(produced.status, produced.content_type, produced.body),
        )
    return Observation(
        reservation=attempt.reservation,
        kind=kind,
        source=Source.ATTEMPT,
        fencing_token=attempt.fencing_token,
        result=result,
    )


def answer_after(settled: Settled, attempt: AttemptRef) -> AttemptAnswer:
    """What the row says after this attempt's own settlement: ``replayed`` unless it stored
    the outcome; superseded if the row is of a later epoch than the attempt."""
    stored = isinstance(settled.decision, Apply) and settled.record.state.terminal
    return attempt_answer(
        settled.record, stored_by_attempt=stored, epoch=attempt.reservation.binding_generation
    )


def attempt_of(
    claimed: ClaimOutcome, principal: Principal, provider: ProviderClient | None = None
) -> tuple[AttemptRef, ExecutionContext]:
    """What a freshly claimed attempt knows about itself (``provider``: what an external
    effect calls)."""
    record = claimed.record
    assert record is not None and claimed.attempt_id is not None
    attempt = AttemptRef(
        attempt_id=claimed.attempt_id,
        reservation=record.reservation,
        fencing_token=record.fencing_token,
    )
    context = ExecutionContext(
        principal=principal,
        operation_id=uuid.UUID(record.reservation.operation_id),
        binding_generation=record.reservation.binding_generation,
        provider=provider,
    )
    return attempt, context
