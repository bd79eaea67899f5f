"""Admin routes: principals."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

from service.http.auth import AuthError, authenticate, require_role
from service.http.problems import problem_response
from service.store.principals import Role

__all__ = ["PrincipalRequest", "create_principal"]

Tenant = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._-]{1,128}$")]
Name = Annotated[str, msgspec.Meta(pattern=r"^[\x20-\x7e]{1,256}$")]


class PrincipalRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    tenant: Tenant
    name: Name
    role: Role


class PrincipalCreated(msgspec.Struct):
    id: uuid.UUID
    tenant: str
    name: str
    role: str
    credential_generation: int
    api_key: str


@post("/admin/v1/principals", status_code=201, summary="Create a principal (admin)")
async def create_principal(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    admin = await authenticate(request)
    require_role(admin, Role.ADMIN)
    try:
        body = msgspec.json.decode(await request.body(), type=PrincipalRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return problem_response("validation-error", str(exc))
    if not admin.may_act_in(body.tenant):
        raise AuthError("forbidden", f"this admin may not act in tenant {body.tenant!r}")
    principal, key = await state.runtime.principals.create(body.tenant, body.name, body.role)
    created = PrincipalCreated(
        id=principal.id,
        tenant=principal.tenant,
        name=principal.name,
        role=principal.role.value,
        credential_generation=principal.credential_generation,
        api_key=key,
    )
    return Response(
        content=msgspec.json.encode(created), status_code=201, media_type="application/json"
    )
