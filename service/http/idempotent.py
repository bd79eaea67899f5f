"""An idempotent route's request: parse, hand to the use case, render (DESIGN §5 step 1).

Authentication, the Idempotency-Key header and the body (decoded and validated strictly
against the route's schema) are checked here; anything wrong is a 4xx with nothing stored.
The rest of the flow is :class:`service.app.requests.IdempotentRequests`.
"""

from __future__ import annotations

from typing import Any

from litestar.exceptions import ClientException

from service.app.effects import IdempotentRoute
from service.app.requests import Seen
from service.app.root import Settlement
from service.http.auth import AuthError, authenticate, bearer_key, require_role, unknown_key
from service.http.bodies import decode_json
from service.http.keys import IdempotencyKeyError, parse_idempotency_key
from service.http.problems import ProblemError, problem_reply
from service.http.render import prefer_wait, render, stamp_idempotency_headers
from service.http.reply import Call, Reply
from service.store.principals import Principal

__all__ = ["IDEMPOTENT_DESCRIPTION", "answer_idempotent"]

# The OpenAPI description of every idempotent route: the key and the retention policy.
IDEMPOTENT_DESCRIPTION = """\
Idempotent: send an `Idempotency-Key` header (1-255 printable ASCII characters). A retry with
the same key and the same request replays the stored answer (`Idempotent-Replayed: true`);
the same key with another request is 422 `fingerprint-mismatch`.

Retention: a completed or failed result is replayed for `SETTLEMENT_RETENTION` (default 24 h)
after it became terminal (`expires_at` on the operation). Then only a tombstone is kept, and
the key answers 410 `idempotency-key-expired` whatever the body, with nothing executed, for
`SETTLEMENT_TOMBSTONE_RETENTION` (default 30 days). After that the key is new again.
Operations that are in progress, unknown or in conflict never expire.
"""


async def answer_idempotent(
    call: Call,
    settlement: Settlement,
    spec: IdempotentRoute,
    path_params: dict[str, Any] | None = None,
) -> Reply:
    """The route's answer, for Litestar's router and the idempotent lane alike."""
    try:
        principal, seen = await _identify(call, settlement, spec)
    except (AuthError, IdempotencyKeyError) as exc:
        return stamp_idempotency_headers(problem_reply(exc.slug, exc.detail))
    try:
        raw = await call.body()
    except ClientException as exc:
        if exc.status_code != 413:
            raise
        return stamp_idempotency_headers(problem_reply("payload-too-large", str(exc.detail)))
    headers = call.headers
    try:
        body = decode_json(raw, spec.body_type, headers.get("content-type"))
    except ProblemError as exc:
        return stamp_idempotency_headers(problem_reply(exc.slug, exc.detail))
    answer = await settlement.requests.handle(
        spec,
        principal,
        seen,
        body,
        path_params=path_params,
        wait=prefer_wait(headers.get("prefer"), settlement.settings.max_wait),
    )
    return render(answer)


async def _identify(
    call: Call, settlement: Settlement, spec: IdempotentRoute
) -> tuple[Principal, Seen]:
    """The caller and the row of their scope, in one statement. Errors come in the order a
    client fixes them: credentials (401, 403) before the Idempotency-Key header (400)."""
    api_key = bearer_key(call)
    try:
        key = parse_idempotency_key(call.headers.getall("idempotency-key", []))
    except IdempotencyKeyError:
        require_role(await authenticate(call, settlement.principals), *spec.roles)
        raise
    found = await settlement.requests.identify(api_key, spec, key)
    if found is None:
        raise unknown_key()
    require_role(found[0], *spec.roles)
    return found
