"""GET /problems/{slug}: what each problem ``type`` link means, for the person reading it.

One short page per slug the server can send (the SLUGS table and the business failures):
what happened, whether retrying the same request with the same Idempotency-Key is the right
next step, and what to do. HTML by default; JSON on ``Accept: application/json``.

``retry_with_same_key_safe`` is true when sending the same request again with the same key
cannot run the effect twice and may get a different answer (so retrying is the next step);
false when the same retry gets the same answer until something changes first.
"""

from __future__ import annotations

import html
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.params import FromPath

from service.app.effects import BUSINESS_FAILURES
from service.http.problems import SLUGS, problem_response

__all__ = ["PAGES", "ProblemPage", "problem_page"]


class ProblemPage(msgspec.Struct):
    slug: str
    status: int
    title: str
    what_happened: str
    retry_with_same_key_safe: bool
    what_to_do: str


# slug -> (what happened, retry with the same key is the next step, what to do)
_TEXTS: dict[str, tuple[str, bool, str]] = {
    "unauthenticated": (
        "The Authorization header was missing, malformed, or named an API key that is unknown, "
        "revoked or rotated out. Nothing was stored.",
        False,
        "Send Authorization: Bearer <api key> with a current key. After a rotation, a key "
        "reserved under the old key's generation answers binding-mismatch.",
    ),
    "forbidden": (
        "The key is valid but its role (client, observer, admin) may not call this route, or "
        "an admin acted outside its tenant. Nothing was stored.",
        False,
        "Use a key of a principal with the right role and tenant.",
    ),
    "validation-error": (
        "The body or a parameter did not match the route's schema: unknown field, wrong "
        "type, amount out of range, unknown ISO 4217 currency, malformed JSON. Nothing was "
        "stored, so the key is still unused.",
        False,
        "Fix the request (the detail names the field) and send it; the same key may be used.",
    ),
    "idempotency-key-missing": (
        "An idempotent route was called without an Idempotency-Key header. Nothing was stored.",
        False,
        "Send the request with an Idempotency-Key header, the same one on every retry.",
    ),
    "idempotency-key-invalid": (
        "The Idempotency-Key header was not 1-255 printable ASCII characters (bare, or as a "
        "quoted sf-string), or was sent more than once. Nothing was stored.",
        False,
        "Send exactly one valid key, and keep it for every retry of this action.",
    ),
    "fingerprint-mismatch": (
        "This key was already used with a different request (another body or path); the "
        "stored operation is untouched and nothing ran.",
        False,
        "A different request needs a new key. To learn what the key did, GET "
        "/v1/operations?key=<key>; resend the original request to replay its answer.",
    ),
    "binding-mismatch": (
        "The operation under this key was reserved with an earlier credential generation of "
        "this principal (its key was rotated since). A request never overwrites a "
        "reservation, so nothing ran.",
        False,
        "Ask an admin to supersede the operation (POST /admin/v1/operations/{id}/supersede), "
        "which binds it to the current key; then retry with the same key.",
    ),
    "operation-in-progress": (
        "Another attempt holds this operation's lease and is still running it (or the "
        "attempt ended without an outcome while this request waited). This request ran "
        "nothing.",
        True,
        "Retry with the same key after Retry-After seconds, or send Prefer: wait=N to wait for "
        "the outcome; Location points at the status resource.",
    ),
    "operation-conflict": (
        "Two incompatible outcomes were observed for this operation (two results with "
        "different digests, or completed and failed). The server keeps both and decides "
        "neither.",
        False,
        "An operator reconciles it: see the status resource and GET "
        "/admin/v1/operations?state=conflict; a supersede with force: true starts a new epoch.",
    ),
    "operation-superseded": (
        "An admin started a new reservation epoch of this operation while this attempt ran. "
        "What this attempt saw is kept as an observation of the old epoch.",
        True,
        "Retry with the same key: it runs, or replays, the new epoch.",
    ),
    "operation-outcome-unknown": (
        "The provider gave no definitive answer in time (timeout, 5xx or a transport error). "
        "The operation is unknown: the payment may or may not have happened. A late answer is "
        "still settled when it comes.",
        True,
        "Retry with the same key: the provider is called with the same sink key and never "
        "pays twice. The status resource shows the outcome once it is known.",
    ),
    "idempotency-key-expired": (
        "The operation under this key was terminal longer than the retention "
        "(SETTLEMENT_RETENTION) and was purged; a tombstone remembers the key until "
        "forget_at. Nothing runs under this key until then, whatever the body.",
        False,
        "The earlier outcome stands (its state is in the problem). If a new action is meant, "
        "use a new key; after forget_at this key is new again and would run again.",
    ),
    "lease-unavailable": (
        "Redis, which holds the leases, is unreachable (or this attempt lost its lease before "
        "its outcome committed). Without a lease nothing new runs; replays of finished "
        "operations still work.",
        True,
        "Retry with the same key after Retry-After seconds.",
    ),
    "not-found": (
        "No such route or resource, or it belongs to another principal or tenant (whose "
        "existence is never revealed); POST /v1/payouts answers it when no provider is "
        "configured.",
        False,
        "Check the path and the id, and that the key belongs to the resource's owner or an "
        "admin of its tenant.",
    ),
    "method-not-allowed": (
        "The route exists but not with this method (the Allow header lists those it takes).",
        False,
        "Use one of the methods in the Allow header.",
    ),
    "payload-too-large": (
        "The request body was larger than SETTLEMENT_BODY_LIMIT. Nothing was stored.",
        False,
        "Send a smaller body.",
    ),
    "request-timeout": (
        "The request body did not arrive within SETTLEMENT_BODY_TIMEOUT of its headers, and "
        "the connection was closed. Nothing was stored.",
        True,
        "Send the request again with the same key, its body at once.",
    ),
    "unsupported-media-type": (
        "The body was not declared as JSON in UTF-8 (Content-Type: application/json or "
        "application/*+json). Nothing was stored.",
        False,
        "Send Content-Type: application/json with a UTF-8 JSON body.",
    ),
    "too-many-requests": (
        "This principal already runs SETTLEMENT_MAX_RUNNING_PER_PRINCIPAL requests in this "
        "server process and none ended in time. Nothing was written.",
        True,
        "Retry with the same key after Retry-After seconds, or send fewer requests at once.",
    ),
    "invalid-evidence": (
        "The observation's evidence signature does not verify with the provider's secret. It "
        "was recorded as quarantined; the operation is untouched.",
        False,
        "Sign the canonical evidence with HMAC-SHA256 under the shared provider secret.",
    ),
    "evidence-quota-exceeded": (
        "Too much of this observer's evidence was quarantined lately (refused as about no "
        "operation of its tenant, unsigned, or stopped at the tuple gate): "
        "SETTLEMENT_EVIDENCE_QUARANTINE_LIMIT within SETTLEMENT_EVIDENCE_QUARANTINE_WINDOW. "
        "This evidence was not read and nothing was recorded.",
        True,
        "Fix what the observer sends (the signature, the operation ids), then send it again "
        "after Retry-After seconds, when its oldest counted evidence leaves the window.",
    ),
    "service-unavailable": (
        "A dependency was busy or unreachable: no database connection came free, a row stayed "
        "locked past its timeout, or the settlement kept contending. Nothing was written "
        "(the operation, if any, is unknown and a retry runs it).",
        True,
        "Retry with the same key after Retry-After seconds.",
    ),
    "effect-refused": (
        "A rule of the database (a CHECK, unique or foreign-key constraint) refused what the "
        "operation's effect wrote. Its transaction rolled back: nothing was written, and the "
        "operation, if it has a row, is unknown. The server logs the constraint as an error.",
        True,
        "Retry with the same key after Retry-After seconds; if it keeps coming back, report "
        "it with the Request-Id.",
    ),
    "principal-exists": (
        "A principal with this name already exists in the tenant.",
        False,
        "Choose another name, or rotate the existing principal's key.",
    ),
    "principal-limit": (
        "The tenant already holds SETTLEMENT_MAX_PRINCIPALS_PER_TENANT live (unrevoked) "
        "principals. Nothing was created.",
        False,
        "Revoke a principal of the tenant that is no longer needed, then create the new one; "
        "or ask whoever runs the server to raise the setting.",
    ),
    "supersede-needs-force": (
        "The operation is completed, in conflict, or a payout whose outcome is unknown: a new "
        "epoch may let its effect happen a second time, so the supersede was refused.",
        False,
        "Resend the supersede with force: true if running the effect again is intended.",
    ),
    "conflict-in-one-page": (
        "The feed's conflicting identity is an event served twice in one page (at two places "
        "or with two contents). No receipt holds it against the feed, so accepting it could "
        "not let the page pass: nothing was changed, and the alarm stays open.",
        False,
        "Have the source serve the page in order: the feed resumes on its own.",
    ),
    "internal-error": (
        "The server failed on a bug. An idempotent operation is left unknown, not terminal; "
        "nothing of a local effect was committed.",
        True,
        "Retry with the same key; if it keeps failing, report it with the Request-Id.",
    ),
    "insufficient-funds": (
        "The source account's balance was below the amount. This is the transfer's terminal "
        "outcome (failed): stored, and replayed for every retry with this key, even after "
        "the account is funded.",
        False,
        "Fund the source account, then send the transfer with a new key.",
    ),
    "account-not-found": (
        "The source or destination account does not exist in your tenant. This is the "
        "transfer's terminal outcome (failed): stored and replayed for this key.",
        False,
        "Check the account ids, then send the transfer with a new key.",
    ),
    "currency-mismatch": (
        "An account holds another currency than the transfer's. This is the transfer's "
        "terminal outcome (failed): stored and replayed for this key.",
        False,
        "Transfer in the accounts' currency, with a new key.",
    ),
    "balance-limit": (
        "The destination balance would exceed the largest balance (10^15 minor units). This "
        "is the transfer's terminal outcome (failed): stored and replayed for this key.",
        False,
        "Send a smaller amount with a new key.",
    ),
    "payout-declined": (
        "The provider declined the payout. This is its terminal outcome (failed): stored and "
        "replayed for this key; the provider paid nothing.",
        False,
        "Resolve the decline with the provider, then pay out with a new key.",
    ),
}


def _pages() -> dict[str, ProblemPage]:
    titles = {**SLUGS, **BUSINESS_FAILURES}
    missing = set(titles) ^ set(_TEXTS)
    assert not missing, f"problem pages and slugs differ: {sorted(missing)}"
    return {
        slug: ProblemPage(slug, titles[slug][0], titles[slug][1], *_TEXTS[slug])
        for slug in sorted(titles)
    }


PAGES: dict[str, ProblemPage] = _pages()

_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} ({status})</title></head>
<body>
<h1>{title}</h1>
<p><code>/problems/{slug}</code> &middot; HTTP {status}</p>
<h2>What happened</h2>
<p>{what_happened}</p>
<h2>Retry with the same Idempotency-Key?</h2>
<p>{retry}</p>
<h2>What to do</h2>
<p>{what_to_do}</p>
</body></html>
"""


def _html(page: ProblemPage) -> bytes:
    retry = (
        "Yes: the same request with the same key cannot run the effect twice, and may succeed."
        if page.retry_with_same_key_safe
        else "Not as it is: the same request with the same key gets this answer again."
    )
    fields = {k: html.escape(str(v)) for k, v in msgspec.structs.asdict(page).items()}
    return _HTML.format(**{**fields, "retry": html.escape(retry)}).encode()


# What a problem page is served as, the first one the default (a browser's */*).
_PAGE_TYPES = ["text/html", "application/json"]


@get(
    "/problems/{slug:str}",
    operation_id="getProblemPage",
    summary="What a problem type means (no authentication)",
    media_type="text/html",
)
async def problem_page(request: Request[Any, Any, Any], slug: FromPath[str]) -> Response[bytes]:
    page = PAGES.get(slug)
    if page is None:
        return problem_response("not-found", f"no problem type {slug[:64]!r}")
    # Accept's weights and wildcards, as Litestar reads them
    if request.accept.best_match(_PAGE_TYPES, default="text/html") == "application/json":
        return Response(msgspec.json.encode(page), media_type="application/json")
    return Response(_html(page), media_type="text/html; charset=utf-8")
