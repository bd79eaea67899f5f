"""The Idempotency-Key middleware and the idempotent routes' handlers (docs/design.md §5).

Each idempotent route of the registry (:data:`service.app.routes.ROUTES`) is served by an
ordinary Litestar handler that :func:`idempotent_handler` makes from its entry; none is
written per route. The handler carries :class:`IdempotencyKeyMiddleware` (Litestar's public
middleware API, on that route only), which runs before the handler and decides everything
that needs no effect:

1. the caller, the key and the scope's row, in one indexed statement, so errors come in the
   order a client fixes them: credentials (401, 403), then the Idempotency-Key header (400);
2. a body that does not say it is JSON is refused (415) before a byte of it is read; then
   the body, read once (at most ``SETTLEMENT_BODY_LIMIT``: 413), decoded strictly against
   the route's Struct (:func:`service.http.bodies.decode_strict`: no coercion, every failure
   a 400) and fingerprinted;
3. what that row answers with no effect and no lease (``IdempotentRequests.first_answer``):
   a replay, 422 key reused, 409 binding mismatch, conflict or in progress (``Prefer: wait``
   included), 410 expired. The middleware sends it itself.

Only when an effect may run does the request reach the handler, with what the middleware
read and parsed in the ASGI scope's ``state`` (``Prepared``), so nothing is read or parsed
twice; the handler calls the use case that runs effects (``IdempotentRequests.execute``),
the one place where effects run. Anything refused raises; the app's exception table answers
it, with the idempotency headers (``_stamped`` in :mod:`service.http.problems`). Nothing is
stored before the use case runs.

The answers are Litestar's ``ASGIResponse`` rather than a ``Response``: the body is already
encoded, and the conversion a ``Response`` goes through cost about 15 us a request.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.enums import ScopeType
from litestar.handlers import HTTPRouteHandler
from litestar.middleware import ASGIMiddleware
from litestar.response.base import ASGIResponse
from litestar.types import ASGIApp, Receive, Scope, Send

from service.app.effects import IdempotentRoute
from service.app.requests import Prepared, Seen
from service.app.root import Settlement
from service.app.routes import ROUTES
from service.domain.principals import Principal
from service.http.auth import authenticate, bearer_key, require_role, unknown_key
from service.http.bodies import check_json_content_type, decode_strict
from service.http.deps import settlement_of
from service.http.keys import IdempotencyKeyError, parse_idempotency_key
from service.http.problems import IDEMPOTENT, ProblemError
from service.http.render import prefer_wait, render
from service.http.reply import to_asgi

__all__ = [
    "IDEMPOTENT",
    "IDEMPOTENT_DESCRIPTION",
    "IdempotencyKeyMiddleware",
    "idempotent_handler",
    "idempotent_handlers",
]

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
# Where the middleware leaves the request it read (``Prepared``) for the handler: the ASGI
# scope's ``state``, which every Litestar connection of the request shares.
PREPARED = "idempotent_request"
# What a request without a body is told (rather than msgspec's "input data was truncated").
NO_BODY = "the request has no body: send a JSON document"


class IdempotencyKeyMiddleware(ASGIMiddleware):
    """Answers an idempotent request that needs no effect; passes on the others, read."""

    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        request: Request[Any, Any, Any] = Request(scope, receive, send)
        settlement = settlement_of(request)
        spec: IdempotentRoute = request.route_handler.opt[IDEMPOTENT]
        principal, seen = await _identify(request, settlement, spec)
        # a body that does not say it is JSON is refused before a byte of it is read
        check_json_content_type(request.headers.get("content-type"))
        raw = await request.body()  # at most the app's request_max_body_size (413)
        if not raw:
            raise ProblemError("validation-error", NO_BODY)
        body = decode_strict(raw, spec.body_type)
        wait = prefer_wait(request.headers.get("prefer"), settlement.settings.max_wait)
        prepared = settlement.requests.prepare(spec, principal, seen, body, wait=wait)
        first = await settlement.requests.first_answer(prepared)
        if first is not None:
            await to_asgi(render(first))(scope, receive, send)
            return
        request.state[PREPARED] = prepared
        await next_app(scope, receive, send)


async def _identify(
    request: Request[Any, Any, Any], settlement: Settlement, spec: IdempotentRoute
) -> tuple[Principal, Seen]:
    """The caller and the row of their scope, in one statement. A route this server does
    not offer (no provider for an external effect) is 404, but only to a well-formed request
    of a caller who may call it."""
    api_key = bearer_key(request)
    reason = spec.unavailable(settlement.provider)
    try:
        key = parse_idempotency_key(request.headers.getall("idempotency-key", []))
    except IdempotencyKeyError:
        require_role(await authenticate(request, settlement.principals), *spec.roles)
        raise
    if reason is not None:  # off on this server, not an outage
        require_role(await authenticate(request, settlement.principals), *spec.roles)
        raise ProblemError("not-found", reason)
    found = await settlement.requests.identify(api_key, spec, key)
    if found is None:
        raise unknown_key()
    require_role(found[0], *spec.roles)
    return found


_MIDDLEWARE = IdempotencyKeyMiddleware()


async def _execute(request: Request[Any, Any, Any]) -> ASGIResponse:
    """The handler of every idempotent route: the effect of the request the middleware read."""
    prepared: Prepared = request.state[PREPARED]
    found = await settlement_of(request).requests.execute(prepared)
    return to_asgi(render(found))


def idempotent_handler(spec: IdempotentRoute) -> HTTPRouteHandler:
    """The Litestar handler of one registry entry: ``POST <path>`` behind the
    Idempotency-Key middleware. Its header parameters and body are documented by
    :mod:`service.http.contract` (the middleware reads them, not Litestar)."""

    async def handler(request: Request[Any, Any, Any]) -> ASGIResponse:
        return await _execute(request)

    name = "".join("_" + c.lower() if c.isupper() else c for c in spec.operation_id)
    handler.__name__ = handler.__qualname__ = name
    return post(
        spec.path,
        name=name,
        status_code=201,
        operation_id=spec.operation_id,
        summary=spec.summary,
        description=IDEMPOTENT_DESCRIPTION,
        middleware=[_MIDDLEWARE],
        opt={IDEMPOTENT: spec},
    )(handler)


def idempotent_handlers() -> list[HTTPRouteHandler]:
    """One handler per idempotent route of the registry."""
    return [idempotent_handler(spec) for spec in ROUTES]
