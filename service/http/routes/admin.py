"""Admin routes: principals, supersede, resolve and the reconciliation work list."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from litestar import Request, Response, get, post
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from service.app.admin import KEY_PATTERN, PrincipalRequest, ResolveBody, SupersedeBody
from service.domain.principals import Principal, Role
from service.http.auth import authenticate_admin
from service.http.bodies import StrictJson
from service.http.deps import Services
from service.http.guards import caller, caller_of
from service.http.query import refuse_undeclared_query
from service.http.render import render_json_or_problem

__all__ = [
    "create_principal",
    "list_work",
    "resolve_operation",
    "revoke_principal",
    "rotate_principal",
    "supersede_operation",
]

WorkState = Literal["unknown", "conflict", "in_progress"]
# a tenant name, as PrincipalRequest takes it
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"
# Largest page of the work list.
MAX_PAGE = 100


async def _admin(request: Request[Any, Any, Any], settlement: Services) -> Principal:
    return await authenticate_admin(request, settlement.principals)


@post(
    "/admin/v1/principals",
    status_code=201,
    operation_id="createPrincipal",
    summary="Create a principal (admin)",
    guards=[caller(Role.ADMIN, body=True)],
    dto=StrictJson[PrincipalRequest],
    return_dto=None,
)
async def create_principal(
    request: Request[Any, Any, Any], settlement: Services, data: JSONBody[PrincipalRequest]
) -> Response[bytes]:
    created = await settlement.admin.create_principal(caller_of(request), data)
    return render_json_or_problem(created, status_code=201)


@post(
    "/admin/v1/principals/{principal_id:uuid}/rotate",
    status_code=200,
    operation_id="rotatePrincipal",
    summary="Rotate a key",
)
async def rotate_principal(
    request: Request[Any, Any, Any], settlement: Services, principal_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    admin = await _admin(request, settlement)
    return render_json_or_problem(await settlement.admin.rotate_principal(admin, principal_id))


@post(
    "/admin/v1/principals/{principal_id:uuid}/revoke",
    status_code=200,
    operation_id="revokePrincipal",
    summary="Revoke a key",
)
async def revoke_principal(
    request: Request[Any, Any, Any], settlement: Services, principal_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    admin = await _admin(request, settlement)
    return render_json_or_problem(await settlement.admin.revoke_principal(admin, principal_id))


@post(
    "/admin/v1/operations/{operation_id:uuid}/supersede",
    status_code=200,
    operation_id="supersedeOperation",
    summary="Start a new reservation epoch (admin)",
    guards=[caller(Role.ADMIN, body=True)],
    dto=StrictJson[SupersedeBody],
    return_dto=None,
)
async def supersede_operation(
    request: Request[Any, Any, Any],
    settlement: Services,
    operation_id: FromPath[uuid.UUID],
    data: JSONBody[SupersedeBody],
) -> Response[bytes]:
    superseded = await settlement.admin.supersede(caller_of(request), operation_id, data)
    return render_json_or_problem(superseded)


@post(
    "/admin/v1/operations/{operation_id:uuid}/resolve",
    status_code=200,
    operation_id="resolveOperation",
    summary="Settle an unknown or conflict operation as an operator says (admin)",
    guards=[caller(Role.ADMIN, body=True)],
    dto=StrictJson[ResolveBody],
    return_dto=None,
)
async def resolve_operation(
    request: Request[Any, Any, Any],
    settlement: Services,
    operation_id: FromPath[uuid.UUID],
    data: JSONBody[ResolveBody],
) -> Response[bytes]:
    resolved = await settlement.admin.resolve(caller_of(request), operation_id, data)
    return render_json_or_problem(resolved)


@get(
    "/admin/v1/operations",
    operation_id="listWork",
    summary="Reconciliation work list (admin)",
)
async def list_work(
    request: Request[Any, Any, Any],
    settlement: Services,
    op_state: Annotated[WorkState, QueryParameter(name="state")],
    tenant: Annotated[str | None, QueryParameter(pattern=TENANT_PATTERN)] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_PAGE)] = 50,
    after: FromQuery[str | None] = None,
    key: Annotated[
        str | None,
        QueryParameter(
            pattern=KEY_PATTERN,
            description="only the operations with this Idempotency-Key (as stored: unquoted)",
        ),
    ] = None,
) -> Response[bytes]:
    """``state``, ``tenant``, ``limit`` and ``key`` are checked (400) by their declared
    types."""
    admin = await _admin(request, settlement)
    refuse_undeclared_query(request)
    page = await settlement.admin.work_list(admin, op_state, tenant, limit, after, key=key)
    return render_json_or_problem(page)
