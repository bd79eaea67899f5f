"""The idempotent routes' request: caller, key and body checked, then the use case
(docs/design.md §5 step 1).

Each idempotent route of the registry (:data:`service.app.routes.ROUTES`) is served by an
ordinary Litestar handler that :func:`idempotent_handler` makes from its entry; none is written
per route. What it reads is declared in its signature, so Litestar decodes it and the OpenAPI
document shows it:

* the caller and their scope's row come first, from the :func:`identify_caller` hook (it runs
  before Litestar reads a byte of the body). It looks up the API key and the scope in one
  statement, so errors come in the order a client fixes them: credentials (401, 403), then the
  Idempotency-Key header (400), then the body;
* ``data``: the body, through :class:`StrictJson` (a ``MsgspecDTO`` decoding strictly against
  the route's Struct: no coercion, every failure a problem); the hook has refused a body
  that does not say it is JSON (415) before a byte of it is read;
* ``idempotency_key`` and ``prefer``: typed header parameters (the hook has checked the key
  by the rules of :mod:`service.http.keys` already).

Anything refused raises; the app's exception table answers it, with the idempotency headers
(``_stamped`` in :mod:`service.http.problems`). Nothing is stored before the use case runs.

The handler returns Litestar's ``ASGIResponse`` rather than a ``Response``: the answer is
already encoded, and the conversion a ``Response`` goes through cost about 15 us a request.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from litestar import Request, post
from litestar.connection import ASGIConnection
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.spec import Example
from litestar.params import HeaderParameter, JSONBody
from litestar.response.base import ASGIResponse

from service.app.effects import IdempotentRoute
from service.app.requests import Seen
from service.app.root import Settlement
from service.app.routes import ROUTES
from service.domain.principals import Principal
from service.http.auth import authenticate, bearer_key, require_role, unknown_key
from service.http.bodies import StrictJson, check_json_content_type
from service.http.deps import Services, settlement_of
from service.http.keys import MAX_KEY_LENGTH, IdempotencyKeyError, parse_idempotency_key
from service.http.problems import IDEMPOTENT, ProblemError
from service.http.render import prefer_wait, render
from service.http.reply import to_asgi

__all__ = [
    "IDEMPOTENT",
    "IDEMPOTENT_DESCRIPTION",
    "IdempotencyKey",
    "Prefer",
    "answer",
    "idempotent_handler",
    "idempotent_handlers",
    "identify_caller",
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

# printable ASCII, no surrounding space; an sf-string ("...") form is accepted as well
# (described, not in the pattern: a value starting with a quote is read as an sf-string)
KEY_PATTERN = r"^[\x21\x23-\x7e]([\x20-\x7e]*[\x21-\x7e])?$"
# The route's idempotency key. identify_caller checks it (service.http.keys) before the
# handler runs, so its constraints are documented (schema_extra), not checked twice.
IdempotencyKey = Annotated[
    str,
    HeaderParameter(
        name="Idempotency-Key",
        description=(
            "The client's key for this intended action, scoped to (tenant, principal, route):"
            f" 1-{MAX_KEY_LENGTH} printable ASCII characters, bare or as an RFC 8941"
            ' sf-string ("pay-42"). A retry with the same key and request replays the answer.'
        ),
        examples=[Example(value="pay-42")],
        schema_extra={"minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": KEY_PATTERN},
    ),
]
# Prefer (RFC 7240); preferences it does not know are ignored.
Prefer = Annotated[
    str,
    HeaderParameter(
        name="Prefer",
        required=False,
        description=(
            "`wait=N`: if another attempt is in progress, wait up to N seconds (capped by"
            " SETTLEMENT_MAX_WAIT) for it to settle and replay its answer;"
            " `Preference-Applied` says so."
        ),
        examples=[Example(value="wait=5")],
    ),
]


async def identify_caller(connection: Request[Any, Any, Any]) -> None:
    """``before_request`` of every idempotent route: the caller, the key and their scope's
    row, kept in the request's state for the handler.

    A ``before_request`` hook rather than a guard: it runs at the same point (before Litestar
    reads the body), and Litestar calls a guard with a shallow copy of the route handler, made
    for every request (66 attribute writes; 861 -> 785 Python calls per replay, measured with
    cProfile in process)."""
    settlement = settlement_of(connection)
    spec: IdempotentRoute = connection.route_handler.opt[IDEMPOTENT]
    reason = spec.unavailable(settlement.provider)
    if reason is not None:  # a route this server does not offer, not an outage
        # the request's own checks first: only a well-formed request of a caller who may
        # call the route learns that it is off
        require_role(await authenticate(connection, settlement.principals), *spec.roles)
        parse_idempotency_key(connection.headers.getall("idempotency-key", []))
        raise ProblemError("not-found", reason)
    principal, seen = await _identify(connection, settlement, spec)
    # a body that does not say it is JSON is refused before a byte of it is read
    check_json_content_type(connection.headers.get("content-type"))
    connection.state.identified = (spec, principal, seen)


async def _identify(
    connection: ASGIConnection[Any, Any, Any, Any], settlement: Settlement, spec: IdempotentRoute
) -> tuple[Principal, Seen]:
    """The caller and the row of their scope, in one statement."""
    api_key = bearer_key(connection)
    try:
        key = parse_idempotency_key(connection.headers.getall("idempotency-key", []))
    except IdempotencyKeyError:
        require_role(await authenticate(connection, settlement.principals), *spec.roles)
        raise
    found = await settlement.requests.identify(api_key, spec, key)
    if found is None:
        raise unknown_key()
    require_role(found[0], *spec.roles)
    return found


async def answer(
    request: Request[Any, Any, Any],
    settlement: Settlement,
    body: Any,
    prefer: str,
    path_params: dict[str, Any] | None = None,
) -> ASGIResponse:
    """The use case's answer to a request identify_caller identified."""
    spec, principal, seen = request.state.identified
    wait = prefer_wait(prefer, settlement.settings.max_wait)
    found = await settlement.requests.handle(
        spec, principal, seen, body, path_params=path_params, wait=wait
    )
    return to_asgi(render(found))


def idempotent_handler(spec: IdempotentRoute) -> HTTPRouteHandler:
    """The Litestar handler of one registry entry: ``POST <path>``, its body decoded strictly
    as ``spec.body_type``, the caller identified first (:func:`identify_caller`)."""

    async def handler(
        request: Request[Any, Any, Any],
        settlement: Services,
        data: Any,
        idempotency_key: IdempotencyKey,
        prefer: Prefer = "",
    ) -> ASGIResponse:
        return await answer(request, settlement, data, prefer)

    # the body's type is the entry's: Litestar reads it from the signature
    handler.__annotations__ = {
        "request": Request[Any, Any, Any],
        "settlement": Services,
        "data": cast(Any, JSONBody)[spec.body_type],
        "idempotency_key": IdempotencyKey,
        "prefer": Prefer,
        "return": ASGIResponse,
    }
    name = "".join("_" + c.lower() if c.isupper() else c for c in spec.operation_id)
    handler.__name__ = handler.__qualname__ = name
    return post(
        spec.path,
        name=name,
        status_code=201,
        operation_id=spec.operation_id,
        summary=spec.summary,
        description=IDEMPOTENT_DESCRIPTION,
        before_request=identify_caller,
        dto=cast(Any, StrictJson)[spec.body_type],
        return_dto=None,
        opt={IDEMPOTENT: spec},
    )(handler)


def idempotent_handlers() -> list[HTTPRouteHandler]:
    """One handler per idempotent route of the registry."""
    return [idempotent_handler(spec) for spec in ROUTES]
