"""The demo ledger's reads: an account by id (its idempotent routes are the registry's,
service.app.routes)."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Request, Response, get
from litestar.params import FromPath

from service.domain.principals import Role
from service.http.auth import authenticate, require_role
from service.http.deps import Services
from service.http.render import render_json_or_problem

__all__ = ["get_account"]


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
