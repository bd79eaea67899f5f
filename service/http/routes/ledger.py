"""The demo ledger routes: accounts and transfers, idempotent local effects."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, Response, get, post
from litestar.params import FromPath, JSONBody
from litestar.response.base import ASGIResponse

from service.app.routes import ACCOUNTS, TRANSFERS
from service.domain import ledger
from service.domain.principals import Role
from service.http.auth import authenticate, require_role
from service.http.bodies import StrictJson
from service.http.deps import Services
from service.http.idempotent import (
    IDEMPOTENT_DESCRIPTION,
    IdempotencyKey,
    Prefer,
    answer,
    idempotent_opt,
    identify_caller,
)
from service.http.render import render_json_or_problem

__all__ = ["get_account", "post_account", "post_transfer"]


@post(
    ACCOUNTS.path,
    status_code=201,
    operation_id="createAccount",
    summary="Open an account (idempotent)",
    description=IDEMPOTENT_DESCRIPTION,
    before_request=identify_caller,
    dto=StrictJson[ledger.AccountRequest],
    return_dto=None,
    opt=idempotent_opt(lambda settlement: settlement.accounts),
)
async def post_account(
    request: Request[Any, Any, Any],
    settlement: Services,
    data: JSONBody[ledger.AccountRequest],
    idempotency_key: IdempotencyKey,
    prefer: Prefer = "",
) -> ASGIResponse:
    return await answer(request, settlement, data, prefer)


@post(
    TRANSFERS.path,
    status_code=201,
    operation_id="createTransfer",
    summary="Move money between accounts (idempotent)",
    description=IDEMPOTENT_DESCRIPTION,
    before_request=identify_caller,
    dto=StrictJson[ledger.TransferRequest],
    return_dto=None,
    opt=idempotent_opt(lambda settlement: settlement.transfers),
)
async def post_transfer(
    request: Request[Any, Any, Any],
    settlement: Services,
    data: JSONBody[ledger.TransferRequest],
    idempotency_key: IdempotencyKey,
    prefer: Prefer = "",
) -> ASGIResponse:
    return await answer(request, settlement, data, prefer)


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
    return render_json_or_problem(await settlement.account_queries.by_id(principal, account_id))
