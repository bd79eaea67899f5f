"""The server's own app with two baseline routes, served exactly as ``settlement serve`` does.

* ``GET /bench/bare``: a plain JSON answer, no I/O: what the HTTP stack (granian, Litestar,
  msgspec) costs on its own.
* ``POST /bench/plain-transfer``: the ledger's SQL of ``POST /v1/transfers`` without the
  idempotency layer: authenticate, decode the same body, then one statement: the transfer's
  guard (``service.domain.ledger.TRANSFER``), a minimal operation row
  (``transfers.operation_id`` is a NOT NULL foreign key to ``operations``) and the transfer's
  writes. No key, fingerprint, scope read, lease, claim, attempt or observation. The
  operation-row INSERT is the only part a schema without idempotency would not need, so
  ``new / plain-transfer`` slightly understates the idempotency layer's cost.

Every other route of the server is there too (``/health`` is the readiness probe).
``BENCH_LOG_LEVEL`` (default INFO, as the server) sets the root log level of this app, to see
what the per-request INFO lines cost.

Run: ``python -m bench.bare_app --port P --workers N`` (``bench.serve``: granian with the
options of ``service.cli``).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from sqlalchemy import bindparam, exists, insert, literal_column, select

from bench import serve
from service.config import Settings
from service.domain import ledger
from service.domain.principals import Role
from service.http.app import create_app
from service.http.auth import AuthError, authenticate, require_role
from service.http.deps import Services
from service.http.problems import problem_response
from service.store.hot_sql import Prepared, effect_ok_of
from service.store.tables import operations

__all__ = ["PLAIN_ROUTE", "app_factory", "bare", "main", "plain_transfer"]

PLAIN_ROUTE = "POST /bench/plain-transfer"
# Stands in for a request fingerprint in the minimal operation row (never compared).
_NO_FINGERPRINT = "0" * 64


def _plain_statement() -> Prepared:
    """The transfer's guard and writes under the minimal operation row: the foreign-key
    parent of the transfer, nothing more, written only if the guard lets it through."""
    effect = ledger.TRANSFER
    verdict = effect.guard()
    effect_ok = effect_ok_of(verdict)
    columns: tuple[str, ...] = ("id", "tenant", "principal_id", "route", "idempotency_key")
    columns += ("request_fingerprint", "bound_principal_id", "bound_credential_generation")
    written = (
        insert(operations)
        .from_select(
            [*columns, "binding_generation", "state", "revision", "fencing_token"],
            select(
                *(bindparam(name, type_=operations.c[name].type) for name in columns),
                literal_column("1"),
                literal_column("'unknown'"),
                literal_column("1"),
                literal_column("1"),
            ).where(exists(select(effect_ok))),
        )
        .returning(operations.c.id)
        .cte("written")
    )
    writes = effect.apply(written, effect_ok)
    return Prepared(select(select(verdict.c.refusal).scalar_subquery()).add_cte(*writes))


_PLAIN = _plain_statement()


@get("/bench/bare", summary="Baseline: a plain JSON answer without I/O")
async def bare() -> dict[str, bool]:
    return {"ok": True}


@post("/bench/plain-transfer", status_code=201, summary="Baseline: the ledger's SQL only")
async def plain_transfer(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    try:
        principal = await authenticate(request, settlement.principals)
        require_role(principal, Role.CLIENT, Role.ADMIN)
    except AuthError as exc:
        return problem_response(exc.slug, exc.detail)
    try:
        body = msgspec.json.decode(await request.body(), type=ledger.TransferRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return problem_response("validation-error", str(exc))
    operation_id = uuid.uuid4()
    params, made = ledger.transfer_values(principal.tenant, operation_id, 1, body)
    values = {
        "id": operation_id,
        "tenant": principal.tenant,
        "principal_id": principal.id,
        "route": PLAIN_ROUTE,
        "idempotency_key": str(operation_id),
        "request_fingerprint": _NO_FINGERPRINT,
        "bound_principal_id": principal.id,
        "bound_credential_generation": principal.credential_generation,
        **params,
    }
    async with settlement.pool.acquire() as conn:
        refusal = await conn.fetchval(_PLAIN.sql, *_PLAIN.args(values))
    if refusal is not None:  # not expected here: every account is funded
        slug, detail = refusal
        problem = {"type": f"/problems/{slug}", "status": 422, "detail": detail}
        return Response(
            content=msgspec.json.encode(problem),
            status_code=422,
            media_type="application/problem+json",
        )
    return Response(
        content=msgspec.json.encode(made), status_code=201, media_type="application/json"
    )


def app_factory() -> Litestar:
    """ASGI factory: the server's app (settings from the environment) plus the baselines."""
    from service.logs import configure_logging

    settings = Settings.from_env()
    level = logging.getLevelName(os.environ.get("BENCH_LOG_LEVEL", "INFO").upper())
    configure_logging(settings, level=level if isinstance(level, int) else logging.INFO)
    # the start-up line ("server ready") is how the bench knows each worker is up
    logging.getLogger("settlement.app").setLevel(logging.INFO)
    app = create_app(settings)
    app.register(bare)
    app.register(plain_transfer)
    return app


def main(argv: list[str] | None = None) -> None:
    serve.main("bench.bare_app:app_factory", "python -m bench.bare_app", argv)


if __name__ == "__main__":
    main()
