"""One exception class per problem slug the server answers (RFC 9457 ``type`` =
``/problems/<slug>``), each carrying the problem document and the headers that identify the
call: ``Operation-Id``, ``Request-Id``, ``Idempotent-Replayed``.

``RETRY_SAFE`` is the server's ``retry_with_same_key_safe`` (``GET /problems/<slug>``):
resending the same request with the same key cannot run the effect twice and may get another
answer. Every other problem is final: the same retry gets the same answer until something
changes. The table is checked against the server's by the repository's tests.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from settlement_client.models import ProblemDocument

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
    "RequestTimeout",
    "ServiceUnavailable",
    "SettlementError",
    "SupersedeNeedsForce",
    "SupersedeRequired",
    "TooManyRequests",
    "TransportFailed",
    "Unauthenticated",
    "UnknownProblem",
    "UnsupportedMediaType",
    "problem_from",
]


class SettlementError(Exception):
    """Anything the client raises. ``key`` is the call's Idempotency-Key (None on routes
    without one), ``attempts`` how many requests the call sent, ``gave_up`` why retrying
    stopped (``"final"`` for an answer that is never retried, else ``"attempts"``,
    ``"deadline"``, ``"budget"`` or ``"not-idempotent"``)."""

    key: str | None = None
    attempts: int = 0
    gave_up: str = "final"


class TransportFailed(SettlementError):
    """No HTTP answer: the connection failed, or was lost, or timed out. ``sent`` is False
    only when the request certainly never reached the server (no connection was made); when
    True the effect may have run: resend with the same key, or follow the operation."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class Problem(SettlementError):
    """A ``application/problem+json`` answer. Subclasses name one slug each."""

    slug: ClassVar[str] = ""
    status: int
    retry_safe: ClassVar[bool] = False

    def __init__(
        self,
        problem: ProblemDocument,
        *,
        content: bytes = b"",
        operation_id: str | None = None,
        request_id: str | None = None,
        replayed: bool = False,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(f"{problem.status} {problem.type}: {problem.detail}")
        self.problem = problem
        self.status = problem.status
        self.content = content
        self.operation_id = operation_id or problem.operation_id
        self.request_id = request_id
        self.replayed = replayed
        self.retry_after = retry_after


class UnknownProblem(Problem):
    """A slug this client does not know (a newer server): final unless 429/500/503."""


class Unauthenticated(Problem):
    """401: missing, unknown or rotated-out API key."""

    slug = "unauthenticated"


class Forbidden(Problem):
    """403: the key's role may not call this route."""

    slug = "forbidden"


class InvalidRequest(Problem):
    """400 ``validation-error``: the body or a parameter is invalid; nothing was stored."""

    slug = "validation-error"


class IdempotencyKeyMissing(Problem):
    """400: an idempotent route without an Idempotency-Key."""

    slug = "idempotency-key-missing"


class IdempotencyKeyInvalid(Problem):
    """400: not 1-255 printable ASCII characters."""

    slug = "idempotency-key-invalid"


class IdempotencyKeyReused(Problem):
    """422 ``fingerprint-mismatch``: the key was used before with a different request."""

    slug = "fingerprint-mismatch"


class SupersedeRequired(Problem):
    """The operation under this key cannot go on as it is: an operator decides (supersede
    it, or leave it). The client never picks a new key for the same intended action."""


class BindingMismatch(SupersedeRequired):
    """409: the key's reservation is bound to an earlier credential generation (the API key
    was rotated since). An admin supersedes the operation, then the same key is retried."""

    slug = "binding-mismatch"


class OperationInProgress(Problem):
    """409: another attempt holds the operation's lease. Retried with ``Prefer: wait``."""

    slug = "operation-in-progress"
    retry_safe = True


class OperationConflict(SupersedeRequired):
    """409: observations of the outcome disagree; an operator reconciles."""

    slug = "operation-conflict"


class OperationSuperseded(Problem):
    """409: an admin started a new epoch while this attempt ran; the same key runs or
    replays the new epoch (retried)."""

    slug = "operation-superseded"
    retry_safe = True


class OperationOutcomeUnknown(Problem):
    """504: this attempt's external outcome is unknown. Resend the same key, or follow the
    operation with ``wait_for_outcome(operation_id)``; never send a new key."""

    slug = "operation-outcome-unknown"
    retry_safe = True


class EffectRefused(Problem):
    """409: a database constraint refused the effect's writes; nothing was written."""

    slug = "effect-refused"
    retry_safe = True


class KeyExpired(Problem):
    """410 ``idempotency-key-expired``: the key's retention passed (a tombstone remembers
    it); what it did can no longer be replayed."""

    slug = "idempotency-key-expired"


class LeaseUnavailable(Problem):
    """503: the lease store is unreachable; nothing new runs, replays still work."""

    slug = "lease-unavailable"
    retry_safe = True


class NotFound(Problem):
    """404: no such resource (or another principal's)."""

    slug = "not-found"


class MethodNotAllowed(Problem):
    """405."""

    slug = "method-not-allowed"


class PayloadTooLarge(Problem):
    """413: the body is over the server's limit."""

    slug = "payload-too-large"


class RequestTimeout(Problem):
    """408: the body did not arrive in time; nothing was stored."""

    slug = "request-timeout"
    retry_safe = True


class UnsupportedMediaType(Problem):
    """415: the body is not JSON."""

    slug = "unsupported-media-type"


class TooManyRequests(Problem):
    """429: too many requests running for this principal."""

    slug = "too-many-requests"
    retry_safe = True


class EvidenceQuotaExceeded(Problem):
    """429: too much of this observer's evidence was quarantined lately; nothing was recorded."""

    slug = "evidence-quota-exceeded"
    retry_safe = True


class InvalidEvidence(Problem):
    """422: evidence whose signature does not verify."""

    slug = "invalid-evidence"


class ServiceUnavailable(Problem):
    """503: the server cannot serve now (database unreachable, busy)."""

    slug = "service-unavailable"
    retry_safe = True


class PrincipalExists(Problem):
    """409: a principal of that tenant and name exists."""

    slug = "principal-exists"


class PrincipalLimit(Problem):
    """409: the tenant holds as many live principals as the server allows."""

    slug = "principal-limit"


class SupersedeNeedsForce(Problem):
    """409: superseding a completed operation needs ``force=True`` (the effect may run
    again)."""

    slug = "supersede-needs-force"


class ConflictInOnePage(Problem):
    """409: a feed's conflicting identity served twice in one page cannot be accepted (the
    source must serve the page in order)."""

    slug = "conflict-in-one-page"


class InternalError(Problem):
    """500: a server bug; the same key is safe to retry."""

    slug = "internal-error"
    retry_safe = True


class InsufficientFunds(Problem):
    """402: the source balance is below the amount (a stored, replayed ``failed``)."""

    slug = "insufficient-funds"


class AccountNotFound(Problem):
    """404: an account of the transfer does not exist (a stored, replayed ``failed``)."""

    slug = "account-not-found"


class CurrencyMismatch(Problem):
    """422: the accounts' currency is not the transfer's (a stored, replayed ``failed``)."""

    slug = "currency-mismatch"


class BalanceLimit(Problem):
    """422: the destination would go past the balance limit (a stored ``failed``)."""

    slug = "balance-limit"


class PayoutDeclined(Problem):
    """402: the provider declined the payout (a stored, replayed ``failed``)."""

    slug = "payout-declined"


def _all(cls: type[Problem]) -> list[type[Problem]]:
    found: list[type[Problem]] = []
    for sub in cls.__subclasses__():
        found.extend([sub] if sub.slug else [])
        found.extend(_all(sub))
    return found


# slug -> exception class, for every slug of the server (and business failures)
PROBLEMS: dict[str, type[Problem]] = {cls.slug: cls for cls in _all(Problem)}
RETRY_SAFE: frozenset[str] = frozenset(slug for slug, cls in PROBLEMS.items() if cls.retry_safe)
PROBLEM_CONTENT_TYPE = "application/problem+json"
_decode = msgspec.json.Decoder(ProblemDocument)


def slug_of(problem: ProblemDocument) -> str:
    return problem.type.rsplit("/", 1)[-1]


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
    try:
        problem = _decode.decode(content)
    except msgspec.DecodeError:
        problem = ProblemDocument(
            type="/problems/unknown",
            title="Unreadable problem document",
            status=status,
            detail=content[:200].decode(errors="replace"),
        )
    cls = PROBLEMS.get(slug_of(problem), UnknownProblem)
    return cls(
        problem,
        content=content,
        operation_id=operation_id,
        request_id=request_id,
        replayed=replayed,
        retry_after=retry_after,
    )
