"""The demo ledger routes: accounts and transfers, idempotent local effects."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, Response, get, post
from litestar.params import FromPath

from service.app.root import Settlement
from service.domain import ledger
from service.http.auth import authenticate, require_role
from service.http.deps import Services
from service.http.idempotent import IDEMPOTENT_DESCRIPTION, answer_idempotent
from service.http.problems import problem_response
from service.http.render import json_response
from service.http.reply import LANE_ANSWER, Call, Reply, to_response
from service.store.principals import Role

__all__ = ["answer_account", "answer_transfer", "get_account", "post_account", "post_transfer"]


async def answer_account(call: Call, settlement: Settlement) -> Reply:
    return await answer_idempotent(call, settlement, settlement.accounts)


@post(
    "/v1/accounts",
    status_code=201,
    operation_id="createAccount",
    summary="Open an account (idempotent)",
    description=IDEMPOTENT_DESCRIPTION,
    opt={LANE_ANSWER: answer_account},
)
async def post_account(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    return to_response(await answer_account(request, settlement))


async def answer_transfer(call: Call, settlement: Settlement) -> Reply:
    return await answer_idempotent(call, settlement, settlement.transfers)


@post(
    "/v1/transfers",
    status_code=201,
    operation_id="createTransfer",
    summary="Move money between accounts (idempotent)",
    description=IDEMPOTENT_DESCRIPTION,
    opt={LANE_ANSWER: answer_transfer},
)
async def post_transfer(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    return to_response(await answer_transfer(request, settlement))


@get(
    "/v1/accounts/{account_id:uuid}",
    operation_id="getAccount",
    summary="Read an account of your tenant",
)
async def get_account(
    request: Request[Any, Any, Any], settlement: Services, account_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    principal = await authenticate(request, settlement.principals)
    require_role(principal, Role.CLIENT, Role.ADMIN)
    async with settlement.pool.acquire() as conn:
        account = await ledger.get_account(conn, principal.tenant, account_id)
    if account is None:
        return problem_response("not-found", f"no account {account_id}")
    return json_response(account)
