"""Every problem type the server answers, declared once (RFC 9457 ``type`` =
``/problems/<slug>``; docs/design.md section 6 is the contract: slugs, statuses and titles
are public API).

One :class:`ProblemType` per slug. From this table come: the HTTP error answers
(``service.http.problems``), the business failures a local effect stores as its terminal
``failed`` outcome (``service.app.effects.business_outcome``), the ``/problems/<slug>`` pages
(``service.http.pages``), the ``Retry-After`` / ``Location`` headers of the OpenAPI problem
responses (``service.http.contract``) and the client's exception classes
(``clients/python/settlement_client/problems.py``, written by
``clients/python/scripts/generate_problems.py``). Adding a problem type is one entry here,
then regenerating the client's file.

A plain data module: standard library only, so every layer and the client's generator can
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROBLEM_TYPES", "ProblemType", "business_failures", "problem_type"]


@dataclass(frozen=True, slots=True)
class ProblemType:
    """One problem type: its slug, status and title, then its page's two texts (what
    happened, what to do), then what it carries.

    ``retry_safe``: sending the same request again with the same Idempotency-Key cannot run
    the effect twice and may get another answer (so retrying is the next step); false when
    the same retry gets the same answer until something changes first. ``retry_after``: the
    answer carries ``Retry-After``; ``location``: it also carries ``Location`` (the status
    resource). ``business``: a terminal outcome a local or external effect stores and
    replays (``failed``), not a refusal of the request. ``client_name``: the client's
    exception class when it is not the slug in CamelCase; ``supersede_required``: the
    client's class sits under ``SupersedeRequired`` (an operator decides).
    """

    slug: str
    status: int
    title: str
    what_happened: str
    what_to_do: str
    retry_safe: bool = False
    retry_after: bool = False
    location: bool = False
    business: bool = False
    client_name: str | None = None
    supersede_required: bool = False

    @property
    def type(self) -> str:
        """The problem document's ``type``: the page that explains it."""
        return f"/problems/{self.slug}"

    @property
    def exception_name(self) -> str:
        """The client's exception class for this slug."""
        return self.client_name or "".join(p.capitalize() for p in self.slug.split("-"))


_DECLARED = (
    ProblemType(
        "unauthenticated",
        401,
        "Authentication required",
        "The Authorization header was missing, malformed, or named an API key that is "
        "unknown, revoked or rotated out. Nothing was stored.",
        "Send Authorization: Bearer <api key> with a current key. After a rotation, a key "
        "reserved under the old key's generation answers binding-mismatch.",
    ),
    ProblemType(
        "forbidden",
        403,
        "Forbidden",
        "The key is valid but its role (client, observer, admin) may not call this route, or "
        "an admin acted outside its tenant. Nothing was stored.",
        "Use a key of a principal with the right role and tenant.",
    ),
    ProblemType(
        "validation-error",
        400,
        "Invalid request",
        "The body or a parameter did not match the route's schema: unknown field, wrong type, "
        "amount out of range, unknown ISO 4217 currency, malformed JSON. Nothing was stored, "
        "so the key is still unused.",
        "Fix the request (the detail names the field) and send it; the same key may be used.",
        client_name="InvalidRequest",
    ),
    ProblemType(
        "idempotency-key-missing",
        400,
        "Idempotency-Key header missing",
        "An idempotent route was called without an Idempotency-Key header. Nothing was stored.",
        "Send the request with an Idempotency-Key header, the same one on every retry.",
    ),
    ProblemType(
        "idempotency-key-invalid",
        400,
        "Idempotency-Key header invalid",
        "The Idempotency-Key header was not 1-255 printable ASCII characters (bare, or as a "
        "quoted sf-string), or was sent more than once. Nothing was stored.",
        "Send exactly one valid key, and keep it for every retry of this action.",
    ),
    ProblemType(
        "fingerprint-mismatch",
        422,
        "Idempotency key reused with a different request",
        "This key was already used with a different request (another body or path); the "
        "stored operation is untouched and nothing ran.",
        "A different request needs a new key. To learn what the key did, GET "
        "/v1/operations?key=<key>; resend the original request to replay its answer.",
        client_name="IdempotencyKeyReused",
    ),
    ProblemType(
        "binding-mismatch",
        409,
        "Reservation bound to another credential",
        "The operation under this key was reserved with an earlier credential generation of "
        "this principal (its key was rotated since). A request never overwrites a "
        "reservation, so nothing ran.",
        "Ask an admin to supersede the operation (POST /admin/v1/operations/{id}/supersede), "
        "which binds it to the current key; then retry with the same key.",
        supersede_required=True,
    ),
    ProblemType(
        "operation-in-progress",
        409,
        "Operation in progress",
        "Another attempt holds this operation's lease and is still running it (or the attempt "
        "ended without an outcome while this request waited). This request ran nothing.",
        "Retry with the same key after Retry-After seconds, or send Prefer: wait=N to wait "
        "for the outcome; Location points at the status resource.",
        retry_safe=True,
        retry_after=True,
        location=True,
    ),
    ProblemType(
        "operation-conflict",
        409,
        "Operation outcome in conflict",
        "Two incompatible outcomes were observed for this operation (two results with "
        "different digests, or completed and failed). The server keeps both and decides "
        "neither.",
        "An operator reconciles it: see the status resource and GET "
        "/admin/v1/operations?state=conflict; a supersede with force: true starts a new "
        "epoch.",
        supersede_required=True,
    ),
    ProblemType(
        "operation-superseded",
        409,
        "Operation superseded while this attempt ran",
        "An admin started a new reservation epoch of this operation while this attempt ran. "
        "What this attempt saw is kept as an observation of the old epoch.",
        "Retry with the same key: it runs, or replays, the new epoch.",
        retry_safe=True,
    ),
    ProblemType(
        "operation-outcome-unknown",
        504,
        "Operation outcome unknown",
        "The provider gave no definitive answer in time (timeout, 5xx or a transport error). "
        "The operation is unknown: the payment may or may not have happened. A late answer is "
        "still settled when it comes.",
        "Retry with the same key: the provider is called with the same sink key and never "
        "pays twice. The status resource shows the outcome once it is known.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "effect-refused",
        409,
        "Effect refused by a database constraint",
        "A rule of the database (a CHECK, unique or foreign-key constraint) refused what the "
        "operation's effect wrote. Its transaction rolled back: nothing was written, and the "
        "operation, if it has a row, is unknown. The server logs the constraint as an error.",
        "Retry with the same key after Retry-After seconds; if it keeps coming back, report "
        "it with the Request-Id.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "idempotency-key-expired",
        410,
        "Idempotency key expired",
        "The operation under this key was terminal longer than the retention "
        "(SETTLEMENT_RETENTION) and was purged; a tombstone remembers the key until "
        "forget_at. Nothing runs under this key until then, whatever the body.",
        "The earlier outcome stands (its state is in the problem). If a new action is meant, "
        "use a new key; after forget_at this key is new again and would run again.",
        client_name="KeyExpired",
    ),
    ProblemType(
        "lease-unavailable",
        503,
        "Lease store unavailable",
        "Redis, which holds the leases, is unreachable (or this attempt lost its lease before "
        "its outcome committed). Without a lease nothing new runs; replays of finished "
        "operations still work.",
        "Retry with the same key after Retry-After seconds.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "not-found",
        404,
        "Not found",
        "No such route or resource, or it belongs to another principal or tenant (whose "
        "existence is never revealed); POST /v1/payouts answers it when no provider is "
        "configured.",
        "Check the path and the id, and that the key belongs to the resource's owner or an "
        "admin of its tenant.",
    ),
    ProblemType(
        "method-not-allowed",
        405,
        "Method not allowed",
        "The route exists but not with this method (the Allow header lists those it takes).",
        "Use one of the methods in the Allow header.",
    ),
    ProblemType(
        "payload-too-large",
        413,
        "Payload too large",
        "The request body was larger than SETTLEMENT_BODY_LIMIT. Nothing was stored.",
        "Send a smaller body.",
    ),
    ProblemType(
        "request-timeout",
        408,
        "Request body too slow",
        "The request body did not arrive within SETTLEMENT_BODY_TIMEOUT of its headers, and "
        "the connection was closed. Nothing was stored.",
        "Send the request again with the same key, its body at once.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "unsupported-media-type",
        415,
        "Unsupported media type",
        "The body was not declared as JSON in UTF-8 (Content-Type: application/json or "
        "application/*+json). Nothing was stored.",
        "Send Content-Type: application/json with a UTF-8 JSON body.",
    ),
    ProblemType(
        "too-many-requests",
        429,
        "Too many requests running for this principal",
        "This principal already runs SETTLEMENT_MAX_RUNNING_PER_PRINCIPAL requests in this "
        "server process and none ended in time. Nothing was written.",
        "Retry with the same key after Retry-After seconds, or send fewer requests at once.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "invalid-evidence",
        422,
        "Evidence signature does not verify",
        "The observation's evidence signature does not verify with the provider's secret. It "
        "was recorded as quarantined; the operation is untouched.",
        "Sign the canonical evidence with HMAC-SHA256 under the shared provider secret.",
    ),
    ProblemType(
        "evidence-quota-exceeded",
        429,
        "Too much of this observer's evidence was quarantined",
        "Too much of this observer's evidence was quarantined lately (refused as about no "
        "operation of its tenant, unsigned, or stopped at the tuple gate): "
        "SETTLEMENT_EVIDENCE_QUARANTINE_LIMIT within SETTLEMENT_EVIDENCE_QUARANTINE_WINDOW. "
        "This evidence was not read and nothing was recorded.",
        "Fix what the observer sends (the signature, the operation ids), then send it again "
        "after Retry-After seconds, when its oldest counted evidence leaves the window.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "service-unavailable",
        503,
        "Service unavailable",
        "A dependency was busy or unreachable: no database connection came free, a row stayed "
        "locked past its timeout, or the settlement kept contending. Nothing was written (the "
        "operation, if any, is unknown and a retry runs it).",
        "Retry with the same key after Retry-After seconds.",
        retry_safe=True,
        retry_after=True,
    ),
    ProblemType(
        "principal-exists",
        409,
        "Principal exists",
        "A principal with this name already exists in the tenant.",
        "Choose another name, or rotate the existing principal's key.",
    ),
    ProblemType(
        "principal-limit",
        409,
        "The tenant holds as many principals as it may",
        "The tenant already holds SETTLEMENT_MAX_PRINCIPALS_PER_TENANT live (unrevoked) "
        "principals. Nothing was created.",
        "Revoke a principal of the tenant that is no longer needed, then create the new one; "
        "or ask whoever runs the server to raise the setting.",
    ),
    ProblemType(
        "supersede-needs-force",
        409,
        "Superseding a completed operation needs force",
        "The operation is completed, in conflict, or a payout whose outcome is unknown: a new "
        "epoch may let its effect happen a second time, so the supersede was refused.",
        "Resend the supersede with force: true if running the effect again is intended.",
    ),
    ProblemType(
        "conflict-in-one-page",
        409,
        "An event twice in one page is for the source to fix",
        "The feed's conflicting identity is an event served twice in one page (at two places "
        "or with two contents). No receipt holds it against the feed, so accepting it could "
        "not let the page pass: nothing was changed, and the alarm stays open.",
        "Have the source serve the page in order: the feed resumes on its own.",
    ),
    ProblemType(
        "internal-error",
        500,
        "Internal server error",
        "The server failed on a bug. An idempotent operation is left unknown, not terminal; "
        "nothing of a local effect was committed.",
        "Retry with the same key; if it keeps failing, report it with the Request-Id.",
        retry_safe=True,
    ),
    ProblemType(
        "insufficient-funds",
        402,
        "Insufficient funds",
        "The account to debit (a transfer's source, a refund's destination) had a balance "
        "below the amount. This is the operation's terminal outcome (failed): stored, and "
        "replayed for every retry with this key, even after the account is funded.",
        "Fund the account, then send the request with a new key.",
        business=True,
    ),
    ProblemType(
        "account-not-found",
        404,
        "Account not found",
        "The source or destination account does not exist in your tenant. This is the "
        "transfer's terminal outcome (failed): stored and replayed for this key.",
        "Check the account ids, then send the transfer with a new key.",
        business=True,
    ),
    ProblemType(
        "currency-mismatch",
        422,
        "Currency mismatch",
        "An account (or the refunded transfer) is in another currency than the request's. "
        "This is the operation's terminal outcome (failed): stored and replayed for this key.",
        "Send the request in the accounts' currency, with a new key.",
        business=True,
    ),
    ProblemType(
        "balance-limit",
        422,
        "Balance limit exceeded",
        "The credited account's balance would exceed the largest balance (10^15 minor "
        "units). This is the operation's terminal outcome (failed): stored and replayed for "
        "this key.",
        "Send a smaller amount with a new key.",
        business=True,
    ),
    ProblemType(
        "payout-declined",
        402,
        "Payout declined",
        "The provider declined the payout. This is its terminal outcome (failed): stored and "
        "replayed for this key; the provider paid nothing.",
        "Resolve the decline with the provider, then pay out with a new key.",
        business=True,
    ),
    ProblemType(
        "transfer-not-found",
        404,
        "Transfer not found",
        "The transfer to refund does not exist in your tenant. This is the refund's terminal "
        "outcome (failed): stored and replayed for this key.",
        "Check the transfer id, then send the refund with a new key.",
        business=True,
    ),
    ProblemType(
        "transfer-not-refundable",
        422,
        "Transfer not refundable",
        "The transfer was refunded in full already: nothing of it is left to refund. This is "
        "the refund's terminal outcome (failed): stored and replayed for this key.",
        "Nothing to do: the transfer's refunds are on their operations (status resource).",
        business=True,
    ),
    ProblemType(
        "refund-exceeds-transfer",
        422,
        "Refund exceeds transfer",
        "The amount is more than what is left to refund of the transfer (its amount less "
        "every refund of it so far); the detail says how much is left. This is the refund's "
        "terminal outcome (failed): stored and replayed for this key.",
        "Refund at most what is left, with a new key.",
        business=True,
    ),
    ProblemType(
        "resolution-refused",
        409,
        "Resolution refused",
        "The settlement core did not apply the operator's resolution: the operation is "
        "already terminal with another outcome, an attempt holds a live lease, the outcome "
        "is none of those in conflict, or the operation moved to another epoch. The detail "
        "names the core's reason; the operation is unchanged.",
        "Read the operation's status resource (or its console page): a live attempt settles "
        "it by itself; a terminal outcome stands (a supersede with force runs the effect "
        "again, it does not close a record).",
    ),
)

# slug -> problem type, in declaration order
PROBLEM_TYPES: dict[str, ProblemType] = {problem.slug: problem for problem in _DECLARED}
assert len(PROBLEM_TYPES) == len(_DECLARED), "a slug is declared twice"


def problem_type(slug: str) -> ProblemType:
    """The problem type of ``slug`` (a KeyError names a slug nobody declared)."""
    return PROBLEM_TYPES[slug]


def business_failures() -> dict[str, ProblemType]:
    """The problem types an effect may store as its terminal ``failed`` outcome."""
    return {slug: problem for slug, problem in PROBLEM_TYPES.items() if problem.business}
