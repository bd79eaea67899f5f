"""Typed bodies of the settlement server's contract, generated from the OpenAPI
document (openapi/openapi.json).

Do not edit: run ``python clients/python/scripts/generate_models.py``. A test fails when the
document changes and this module does not.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = [
    "Account",
    "AccountRequest",
    "AttemptView",
    "ClientAnswer",
    "ConflictingResult",
    "EpochView",
    "Explanation",
    "Health",
    "LeaseView",
    "ObservationView",
    "OperationView",
    "Payout",
    "PayoutRequest",
    "PrincipalCreated",
    "PrincipalRequest",
    "PrincipalRevoked",
    "ProblemDocument",
    "ProblemPage",
    "Refund",
    "RefundRequest",
    "ResolutionResult",
    "ResolveBody",
    "Resolved",
    "ResultView",
    "SupersedeBody",
    "Superseded",
    "Transfer",
    "TransferRequest",
    "WorkItem",
    "WorkPage",
]


class Account(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    currency: str
    balance: int


class AccountRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    currency: str
    opening_balance: int = 0


class AttemptView(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    fencing_token: int
    binding_generation: int
    started_at: str
    finished_at: str | None
    outcome: str | None
    response_status: int | None
    error: str | None


class ClientAnswer(msgspec.Struct, kw_only=True, frozen=True):
    """What a client sending the operation's key is answered now."""

    status: int
    type: str
    title: str


class ConflictingResult(msgspec.Struct, kw_only=True, frozen=True):
    """One of a conflict's incompatible outcomes, in arrival order."""

    kind: str
    digest: str
    status: int | None
    stored: bool
    body: Any = None


class EpochView(msgspec.Struct, kw_only=True, frozen=True):
    binding_generation: int
    request_fingerprint: str
    final_state: str
    result_digest: str | None
    reason: str
    superseded_by: str | None
    superseded_at: str
    superseded_by_name: str | None = None


class Explanation(msgspec.Struct, kw_only=True, frozen=True):
    """Why the operation is in its state, in an operator's words, and what clients sending its
    key are answered.
    """

    why: str
    last_error: str | None = None
    clients_answered: ClientAnswer | None = None
    conflicting_results: list[ConflictingResult] | None = None


class Health(msgspec.Struct, kw_only=True, frozen=True):
    status: Literal["degraded", "ok"]
    database: Literal["ok", "timeout", "unavailable"]
    redis: Literal["ok", "timeout", "unavailable"]


class LeaseView(msgspec.Struct, kw_only=True, frozen=True):
    attempt: str | None
    fencing_token: int
    expires_at: str | None


class ObservationView(msgspec.Struct, kw_only=True, frozen=True):
    """One observation settled (or refused) about the operation: who reported what, and what the
    core did with it. ``id``: its place (ids grow with time), the paging cursor.
    """

    id: int
    source: str
    kind: str
    verified: bool
    stage: str
    disposition: str
    reason: str
    revision_before: int | None
    revision_after: int | None
    detail: dict[str, Any] | None
    created_at: str
    admin_name: str | None = None
    result_status: int | None = None
    result_digest: str | None = None


class OperationView(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    tenant: str
    principal_id: str
    key: str
    route: str
    state: str
    binding_generation: int
    request_fingerprint: str
    revision: int
    created_at: str
    updated_at: str
    expires_at: str | None
    result: ResultView | None
    lease: LeaseView | None
    attempts: list[AttemptView]
    epochs: list[EpochView]
    conflict: dict[str, Any] | None
    observations: list[ObservationView]
    older_observations: int | None = None
    principal_name: str | None = None
    request: dict[str, Any] | None = None
    request_path: dict[str, Any] | None = None
    sink_key: str | None = None
    explanation: Explanation | None = None


class Payout(msgspec.Struct, kw_only=True, frozen=True):
    """A payout the provider made (the provider's answer, stored and replayed)."""

    id: str
    provider_reference: str
    amount: int
    currency: str
    beneficiary: str


class PayoutRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    beneficiary: str
    amount: int
    currency: str


class PrincipalCreated(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    tenant: str
    name: str
    role: str
    credential_generation: int
    api_key: str


class PrincipalRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    tenant: str
    name: str
    role: Literal["admin", "client", "observer"]


class PrincipalRevoked(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    tenant: str
    name: str
    revoked_at: str


class ProblemDocument(msgspec.Struct, kw_only=True, frozen=True):
    """An RFC 9457 problem+json body (answered, and stored for business failures)."""

    type: str
    title: str
    status: int
    detail: str
    operation_id: str | None = None
    state: str | None = None
    expired_at: str | None = None
    forget_at: str | None = None


class ProblemPage(msgspec.Struct, kw_only=True, frozen=True):
    slug: str
    status: int
    title: str
    what_happened: str
    retry_with_same_key_safe: bool
    what_to_do: str


class Refund(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    transfer: str
    amount: int
    currency: str
    memo: str | None
    created_at: str


class RefundRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """Refund ``amount`` of transfer ``transfer`` (in its currency) to its source account."""

    transfer: str
    amount: int
    currency: str
    memo: str | None = None


class ResolutionResult(msgspec.Struct, kw_only=True, frozen=True):
    """The answer to store: a 2xx and its body for ``completed``, a 4xx (a problem's fields, or
    any JSON object) for ``failed``.
    """

    status: int
    body: dict[str, Any]


class ResolveBody(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    outcome: Literal["completed", "failed"]
    provider_reference: str
    reason: str
    result: ResolutionResult


class Resolved(msgspec.Struct, kw_only=True, frozen=True):
    operation: OperationView
    disposition: str
    reason: str


class ResultView(msgspec.Struct, kw_only=True, frozen=True):
    status: int
    digest: str
    content_type: str
    body: Any


class SupersedeBody(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    reason: str
    request: Any | None = None
    rebind: bool = True
    force: bool = False


class Superseded(msgspec.Struct, kw_only=True, frozen=True):
    operation: OperationView
    effect_may_run_again: bool
    fenced_live_attempt: bool


class Transfer(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    source: str
    destination: str
    amount: int
    currency: str
    memo: str | None
    created_at: str


class TransferRequest(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """source and destination must be different accounts (400 otherwise)"""

    source: str
    destination: str
    amount: int
    currency: str
    memo: str | None = None


class WorkItem(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    tenant: str
    principal_id: str
    key: str
    route: str
    state: str
    binding_generation: int
    revision: int
    created_at: str
    updated_at: str


class WorkPage(msgspec.Struct, kw_only=True, frozen=True):
    items: list[WorkItem]
    next: str | None
