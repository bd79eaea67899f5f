"""Payments as the provider records them: the request, the signed evidence, the stored answer.

One payment per sink key. A payment is either ``completed`` (HTTP 201, evidence outcome
``completed``) or ``declined`` (HTTP 402, evidence outcome ``failed``); either way the row is
the answer, and every later call with the same sink key gets exactly the same bytes back.

The evidence names the caller's reservation tuple, so the simulator signs only a tuple that
describes what it pays: :func:`paid_fingerprint` recomputes the request fingerprint from the
payment's own beneficiary, amount and currency with the server's function
(:func:`service.domain.payouts.payout_fingerprint`, which covers nothing else: the payout
route has no path parameters and the fingerprint no tenant or principal), and the app
refuses a call whose ``request_fingerprint`` differs. Paying ``MALLORY`` under a victim's
tuple would need a beneficiary with the victim's fingerprint: a SHA-256 preimage.
"""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from service.domain.payouts import PayoutRequest, payout_fingerprint
from service.evidence import (
    Evidence,
    EvidenceResult,
    canonical,
    content_type_for,
    result_digest,
    sign,
    stored_body,
)

__all__ = [
    "MAX_BENEFICIARY_LENGTH",
    "Outcome",
    "Payment",
    "PaymentRequest",
    "answer_body",
    "new_reference",
    "paid_fingerprint",
    "record_payment",
]

# Beneficiary names longer than this are not names; bounds each stored row.
MAX_BENEFICIARY_LENGTH = 128
# Random hex digits after "pay_": 96 bits, so two references never collide in practice.
REFERENCE_HEX_DIGITS = 24

CREATED = 201
DECLINED = 402

Outcome = Literal["completed", "declined"]


class PaymentRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /payments``, validated while it is decoded."""

    operation_id: uuid.UUID
    binding_generation: Annotated[int, msgspec.Meta(ge=1)]
    request_fingerprint: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    beneficiary: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_BENEFICIARY_LENGTH)]
    amount: Annotated[int, msgspec.Meta(gt=0)]
    currency: Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}$")]


class Payment(msgspec.Struct, frozen=True):
    """One committed row: what was asked (canonical JSON) and what was answered."""

    sink_key: str
    reference: str
    request: bytes
    outcome: Outcome
    status: int
    evidence: bytes
    signature: str
    created_at: str


class _Answer(msgspec.Struct):
    reference: str
    evidence: msgspec.Raw
    signature: str


def paid_fingerprint(request: PaymentRequest) -> str:
    """The fingerprint of the payout this payment makes, computed as the server computes it.

    Raises ``msgspec.ValidationError`` when the payout is not one the server would accept
    (its schema is stricter than the payment's), since no reservation can stand for it.
    """
    fields = {
        "beneficiary": request.beneficiary,
        "amount": request.amount,
        "currency": request.currency,
    }
    return payout_fingerprint(msgspec.convert(fields, type=PayoutRequest))


def new_reference() -> str:
    return "pay_" + secrets.token_hex(REFERENCE_HEX_DIGITS // 2)


def record_payment(
    sink_key: str,
    request: PaymentRequest,
    *,
    outcome: Outcome,
    reference: str,
    now: datetime,
    secret: str,
) -> Payment:
    """Build the row for a new payment: its result, the evidence of it, and the signature."""
    operation_id = str(request.operation_id)
    body: dict[str, Any]
    if outcome == "completed":
        status, evidence_outcome = CREATED, "completed"
        body = {
            "id": operation_id,
            "provider_reference": reference,
            "amount": request.amount,
            "currency": request.currency,
            "beneficiary": request.beneficiary,
        }
    else:
        status, evidence_outcome = DECLINED, "failed"
        body = {
            "type": "/problems/payout-declined",
            "title": "Payout declined",
            "status": DECLINED,
            "detail": "the provider declined the payout",
            "operation_id": operation_id,
            "state": "failed",
        }
    result = EvidenceResult(status=status, body=body)
    evidence = Evidence(
        operation_id=request.operation_id,
        binding_generation=request.binding_generation,
        request_fingerprint=request.request_fingerprint,
        outcome="completed" if evidence_outcome == "completed" else "failed",
        result=result,
        result_digest=result_digest(
            status, content_type_for(evidence_outcome), stored_body(result)
        ),
        issued_at=now.isoformat(),
    )
    return Payment(
        sink_key=sink_key,
        reference=reference,
        request=canonical(request),
        outcome=outcome,
        status=status,
        evidence=canonical(evidence),
        signature=sign(evidence, secret),
        created_at=now.isoformat(),
    )


def answer_body(payment: Payment) -> bytes:
    """``{"reference", "evidence", "signature"}``: the same bytes for every call of a sink key."""
    return msgspec.json.encode(
        _Answer(
            reference=payment.reference,
            evidence=msgspec.Raw(payment.evidence),
            signature=payment.signature,
        )
    )
