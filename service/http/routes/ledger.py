"""The demo ledger routes: accounts and transfers, idempotent local effects."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath
from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain import ledger
from service.http.auth import authenticate, require_role
from service.http.idempotency import ExecutionContext, IdempotentRoute, Outcome
from service.http.problems import problem_response
from service.store.principals import Role

__all__ = ["ACCOUNTS", "TRANSFERS", "get_account", "post_account", "post_transfer"]


async def _create_account(
    conn: AsyncConnection, ctx: ExecutionContext, body: ledger.AccountRequest
) -> Outcome:
    account = await ledger.create_account(
        conn, ctx.principal.tenant, ctx.operation_id, ctx.binding_generation, body
    )
    return Outcome(status=201, body=msgspec.json.encode(account))


async def _transfer(
    conn: AsyncConnection, ctx: ExecutionContext, body: ledger.TransferRequest
) -> Outcome:
    made = await ledger.transfer(
        conn, ctx.principal.tenant, ctx.operation_id, ctx.binding_generation, body
    )
    return Outcome(status=201, body=msgspec.json.encode(made))


ACCOUNTS = IdempotentRoute(
    route="POST /v1/accounts", body_type=ledger.AccountRequest, execute=_create_account
)
TRANSFERS = IdempotentRoute(
    route="POST /v1/transfers", body_type=ledger.TransferRequest, execute=_transfer
)


@post("/v1/accounts", status_code=201, summary="Open an account (idempotent)")
async def post_account(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    response: Response[bytes] = await state.runtime.idempotency.handle(request, ACCOUNTS)
    return response


@post("/v1/transfers", status_code=201, summary="Move money between accounts (idempotent)")
async def post_transfer(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    response: Response[bytes] = await state.runtime.idempotency.handle(request, TRANSFERS)
    return response


@get("/v1/accounts/{account_id:uuid}", summary="Read an account of your tenant")
async def get_account(
    request: Request[Any, Any, Any], state: State, account_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    principal = await authenticate(request)
    require_role(principal, Role.CLIENT, Role.ADMIN)
    async with state.runtime.reader.connect() as conn:
        account = await ledger.get_account(conn, principal.tenant, account_id)
    if account is None:
        return problem_response("not-found", f"no account {account_id}")
    return Response(content=msgspec.json.encode(account), media_type="application/json")
