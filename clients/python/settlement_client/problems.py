"""One exception class per problem slug the server answers (RFC 9457 ``type`` =
``/problems/<slug>``), each carrying the problem document and the headers that identify the
call: ``Operation-Id``, ``Request-Id``, ``Idempotent-Replayed``.

``RETRY_SAFE`` is the server's ``retry_with_same_key_safe`` (``GET /problems/<slug>``):
resending the same request with the same key cannot run the effect twice and may get another
answer. Every other problem is final: the same retry gets the same answer until something
changes.

Do not edit: generated from the server's problem types (service/problem_types.py) by
``python clients/python/scripts/generate_problems.py``; a test fails when they differ.
"""

from __future__ import annotations

from settlement_client._problem_base import (
    PROBLEM_CONTENT_TYPE as PROBLEM_CONTENT_TYPE,
)
from settlement_client._problem_base import (
    Problem,
    SettlementError,
    SupersedeRequired,
    TransportFailed,
    UnknownProblem,
    read_problem,
    slug_of,
)

__all__ = [
    "PROBLEMS",
    "RETRY_SAFE",
    "AccountNotFound",
    "BalanceLimit",
    "BindingMismatch",
    "ConflictInOnePage",
    "CurrencyMismatch",
    "EffectRefused",
    "EvidenceQuotaExceeded",
    "Forbidden",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "IdempotencyKeyReused",
    "InsufficientFunds",
    "InternalError",
    "InvalidEvidence",
    "InvalidRequest",
    "KeyExpired",
    "LeaseUnavailable",
    "MethodNotAllowed",
    "NotFound",
    "OperationConflict",
    "OperationInProgress",
    "OperationOutcomeUnknown",
    "OperationSuperseded",
    "PayloadTooLarge",
    "PayoutDeclined",
    "PrincipalExists",
    "PrincipalLimit",
    "Problem",
    "RefundExceedsTransfer",
    "RequestTimeout",
    "ResolutionRefused",
    "ServiceUnavailable",
    "SettlementError",
    "SupersedeNeedsForce",
    "SupersedeRequired",
    "TooManyRequests",
    "TransferNotFound",
    "TransferNotRefundable",
    "TransportFailed",
    "Unauthenticated",
    "UnknownProblem",
    "UnsupportedMediaType",
    "problem_from",
]


class Unauthenticated(Problem):
    """401 ``unauthenticated``: Authentication required. Send Authorization: Bearer <api key>
    with a current key. After a rotation, a key reserved under the old key's generation answers
    binding-mismatch."""

    slug = "unauthenticated"


class Forbidden(Problem):
    """403 ``forbidden``: Forbidden. Use a key of a principal with the right role and tenant."""

    slug = "forbidden"


class InvalidRequest(Problem):
    """400 ``validation-error``: Invalid request. Fix the request (the detail names the field)
    and send it; the same key may be used."""

    slug = "validation-error"


class IdempotencyKeyMissing(Problem):
    """400 ``idempotency-key-missing``: Idempotency-Key header missing. Send the request with an
    Idempotency-Key header, the same one on every retry."""

    slug = "idempotency-key-missing"


class IdempotencyKeyInvalid(Problem):
    """400 ``idempotency-key-invalid``: Idempotency-Key header invalid. Send exactly one valid
    key, and keep it for every retry of this action."""

    slug = "idempotency-key-invalid"


class IdempotencyKeyReused(Problem):
    """422 ``fingerprint-mismatch``: Idempotency key reused with a different request. A
    different request needs a new key. To learn what the key did, GET /v1/operations?key=<key>;
    resend the original request to replay its answer."""

    slug = "fingerprint-mismatch"


class BindingMismatch(SupersedeRequired):
    """409 ``binding-mismatch``: Reservation bound to another credential. Ask an admin to
    supersede the operation (POST /admin/v1/operations/{id}/supersede), which binds it to the
    current key; then retry with the same key."""

    slug = "binding-mismatch"


class OperationInProgress(Problem):
    """409 ``operation-in-progress``: Operation in progress. Retry with the same key after
    Retry-After seconds, or send Prefer: wait=N to wait for the outcome; Location points at the
    status resource."""

    slug = "operation-in-progress"
    retry_safe = True


class OperationConflict(SupersedeRequired):
    """409 ``operation-conflict``: Operation outcome in conflict. An operator reconciles it: see
    the status resource and GET /admin/v1/operations?state=conflict; a supersede with force:
    true starts a new epoch."""

    slug = "operation-conflict"


class OperationSuperseded(Problem):
    """409 ``operation-superseded``: Operation superseded while this attempt ran. Retry with the
    same key: it runs, or replays, the new epoch."""

    slug = "operation-superseded"
    retry_safe = True


class OperationOutcomeUnknown(Problem):
    """504 ``operation-outcome-unknown``: Operation outcome unknown. Retry with the same key:
    the provider is called with the same sink key and never pays twice. The status resource
    shows the outcome once it is known."""

    slug = "operation-outcome-unknown"
    retry_safe = True


class EffectRefused(Problem):
    """409 ``effect-refused``: Effect refused by a database constraint. Retry with the same key
    after Retry-After seconds; if it keeps coming back, report it with the Request-Id."""

    slug = "effect-refused"
    retry_safe = True


class KeyExpired(Problem):
    """410 ``idempotency-key-expired``: Idempotency key expired. The earlier outcome stands (its
    state is in the problem). If a new action is meant, use a new key; after forget_at this key
    is new again and would run again."""

    slug = "idempotency-key-expired"


class LeaseUnavailable(Problem):
    """503 ``lease-unavailable``: Lease store unavailable. Retry with the same key after Retry-
    After seconds."""

    slug = "lease-unavailable"
    retry_safe = True


class NotFound(Problem):
    """404 ``not-found``: Not found. Check the path and the id, and that the key belongs to the
    resource's owner or an admin of its tenant."""

    slug = "not-found"


class MethodNotAllowed(Problem):
    """405 ``method-not-allowed``: Method not allowed. Use one of the methods in the Allow
    header."""

    slug = "method-not-allowed"


class PayloadTooLarge(Problem):
    """413 ``payload-too-large``: Payload too large. Send a smaller body."""

    slug = "payload-too-large"


class RequestTimeout(Problem):
    """408 ``request-timeout``: Request body too slow. Send the request again with the same key,
    its body at once."""

    slug = "request-timeout"
    retry_safe = True


class UnsupportedMediaType(Problem):
    """415 ``unsupported-media-type``: Unsupported media type. Send Content-Type:
    application/json with a UTF-8 JSON body."""

    slug = "unsupported-media-type"


class TooManyRequests(Problem):
    """429 ``too-many-requests``: Too many requests running for this principal. Retry with the
    same key after Retry-After seconds, or send fewer requests at once."""

    slug = "too-many-requests"
    retry_safe = True


class InvalidEvidence(Problem):
    """422 ``invalid-evidence``: Evidence signature does not verify. Sign the canonical evidence
    with HMAC-SHA256 under the shared provider secret."""

    slug = "invalid-evidence"


class EvidenceQuotaExceeded(Problem):
    """429 ``evidence-quota-exceeded``: Too much of this observer's evidence was quarantined.
    Fix what the observer sends (the signature, the operation ids), then send it again after
    Retry-After seconds, when its oldest counted evidence leaves the window."""

    slug = "evidence-quota-exceeded"
    retry_safe = True


class ServiceUnavailable(Problem):
    """503 ``service-unavailable``: Service unavailable. Retry with the same key after Retry-
    After seconds."""

    slug = "service-unavailable"
    retry_safe = True


class PrincipalExists(Problem):
    """409 ``principal-exists``: Principal exists. Choose another name, or rotate the existing
    principal's key."""

    slug = "principal-exists"


class PrincipalLimit(Problem):
    """409 ``principal-limit``: The tenant holds as many principals as it may. Revoke a
    principal of the tenant that is no longer needed, then create the new one; or ask whoever
    runs the server to raise the setting."""

    slug = "principal-limit"


class SupersedeNeedsForce(Problem):
    """409 ``supersede-needs-force``: Superseding a completed operation needs force. Resend the
    supersede with force: true if running the effect again is intended."""

    slug = "supersede-needs-force"


class ConflictInOnePage(Problem):
    """409 ``conflict-in-one-page``: An event twice in one page is for the source to fix. Have
    the source serve the page in order: the feed resumes on its own."""

    slug = "conflict-in-one-page"


class InternalError(Problem):
    """500 ``internal-error``: Internal server error. Retry with the same key; if it keeps
    failing, report it with the Request-Id."""

    slug = "internal-error"
    retry_safe = True


class InsufficientFunds(Problem):
    """402 ``insufficient-funds``: Insufficient funds. Fund the account, then send the request
    with a new key."""

    slug = "insufficient-funds"


class AccountNotFound(Problem):
    """404 ``account-not-found``: Account not found. Check the account ids, then send the
    transfer with a new key."""

    slug = "account-not-found"


class CurrencyMismatch(Problem):
    """422 ``currency-mismatch``: Currency mismatch. Send the request in the accounts' currency,
    with a new key."""

    slug = "currency-mismatch"


class BalanceLimit(Problem):
    """422 ``balance-limit``: Balance limit exceeded. Send a smaller amount with a new key."""

    slug = "balance-limit"


class PayoutDeclined(Problem):
    """402 ``payout-declined``: Payout declined. Resolve the decline with the provider, then pay
    out with a new key."""

    slug = "payout-declined"


class TransferNotFound(Problem):
    """404 ``transfer-not-found``: Transfer not found. Check the transfer id, then send the
    refund with a new key."""

    slug = "transfer-not-found"


class TransferNotRefundable(Problem):
    """422 ``transfer-not-refundable``: Transfer not refundable. Nothing to do: the transfer's
    refunds are on their operations (status resource)."""

    slug = "transfer-not-refundable"


class RefundExceedsTransfer(Problem):
    """422 ``refund-exceeds-transfer``: Refund exceeds transfer. Refund at most what is left,
    with a new key."""

    slug = "refund-exceeds-transfer"


class ResolutionRefused(Problem):
    """409 ``resolution-refused``: Resolution refused. Read the operation's status resource (or
    its console page): a live attempt settles it by itself; a terminal outcome stands (a
    supersede with force runs the effect again, it does not close a record)."""

    slug = "resolution-refused"


# slug -> exception class, for every slug of the server (and business failures)
PROBLEMS: dict[str, type[Problem]] = {
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "validation-error": InvalidRequest,
    "idempotency-key-missing": IdempotencyKeyMissing,
    "idempotency-key-invalid": IdempotencyKeyInvalid,
    "fingerprint-mismatch": IdempotencyKeyReused,
    "binding-mismatch": BindingMismatch,
    "operation-in-progress": OperationInProgress,
    "operation-conflict": OperationConflict,
    "operation-superseded": OperationSuperseded,
    "operation-outcome-unknown": OperationOutcomeUnknown,
    "effect-refused": EffectRefused,
    "idempotency-key-expired": KeyExpired,
    "lease-unavailable": LeaseUnavailable,
    "not-found": NotFound,
    "method-not-allowed": MethodNotAllowed,
    "payload-too-large": PayloadTooLarge,
    "request-timeout": RequestTimeout,
    "unsupported-media-type": UnsupportedMediaType,
    "too-many-requests": TooManyRequests,
    "invalid-evidence": InvalidEvidence,
    "evidence-quota-exceeded": EvidenceQuotaExceeded,
    "service-unavailable": ServiceUnavailable,
    "principal-exists": PrincipalExists,
    "principal-limit": PrincipalLimit,
    "supersede-needs-force": SupersedeNeedsForce,
    "conflict-in-one-page": ConflictInOnePage,
    "internal-error": InternalError,
    "insufficient-funds": InsufficientFunds,
    "account-not-found": AccountNotFound,
    "currency-mismatch": CurrencyMismatch,
    "balance-limit": BalanceLimit,
    "payout-declined": PayoutDeclined,
    "transfer-not-found": TransferNotFound,
    "transfer-not-refundable": TransferNotRefundable,
    "refund-exceeds-transfer": RefundExceedsTransfer,
    "resolution-refused": ResolutionRefused,
}
RETRY_SAFE: frozenset[str] = frozenset(slug for slug, cls in PROBLEMS.items() if cls.retry_safe)


def problem_from(
    content: bytes,
    *,
    status: int,
    operation_id: str | None,
    request_id: str | None,
    replayed: bool,
    retry_after: str | None,
) -> Problem:
    """The exception for one problem answer (an unreadable body becomes UnknownProblem)."""
    problem = read_problem(content, status=status)
    cls = PROBLEMS.get(slug_of(problem), UnknownProblem)
    return cls(
        problem,
        content=content,
        operation_id=operation_id,
        request_id=request_id,
        replayed=replayed,
        retry_after=retry_after,
    )
