"""Admin routes: principals."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, QueryParameter

from service.core import Refuse, RefuseReason
from service.http.auth import AuthError, authenticate, require_role
from service.http.fingerprint import fingerprint
from service.http.problems import problem_response
from service.store.principals import Principal, Role
from service.store.rows import Scope
from service.store.status import OperationView, operation_view
from service.store.worklist import BadCursor, list_operations

__all__ = [
    "PrincipalRequest",
    "create_principal",
    "list_work",
    "rotate_principal",
    "supersede_operation",
]

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
    _admin_of(admin, body.tenant)
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


def _admin_of(admin: Principal, tenant: str) -> None:
    if not admin.may_act_in(tenant):
        raise AuthError("forbidden", f"this admin may not act in tenant {tenant!r}")


@post("/admin/v1/principals/{principal_id:uuid}/rotate", status_code=200, summary="Rotate a key")
async def rotate_principal(
    request: Request[Any, Any, Any], state: State, principal_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    admin = await authenticate(request)
    require_role(admin, Role.ADMIN)
    principals = state.runtime.principals
    target = await principals.get(principal_id)
    if target is None or not admin.may_act_in(target.tenant):
        return problem_response("not-found", f"no principal {principal_id}")
    rotated = await principals.rotate(principal_id)
    if rotated is None:
        return problem_response("not-found", f"no live principal {principal_id}")
    principal, key = rotated
    body = PrincipalCreated(
        id=principal.id,
        tenant=principal.tenant,
        name=principal.name,
        role=principal.role.value,
        credential_generation=principal.credential_generation,
        api_key=key,
    )
    return Response(content=msgspec.json.encode(body), media_type="application/json")


Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=r"^[^\x00]*$")]


class SupersedeBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    reason: Reason
    request: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    rebind: bool = True
    force: bool = False


class Superseded(msgspec.Struct):
    operation: OperationView
    effect_may_run_again: bool  # completed before, or an external outcome unknown
    fenced_live_attempt: bool


@post(
    "/admin/v1/operations/{operation_id:uuid}/supersede",
    status_code=200,
    summary="Start a new reservation epoch (admin)",
)
async def supersede_operation(
    request: Request[Any, Any, Any], state: State, operation_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    runtime = state.runtime
    admin = await authenticate(request)
    require_role(admin, Role.ADMIN)
    try:
        body = msgspec.json.decode(await request.body(), type=SupersedeBody)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return problem_response("validation-error", str(exc))
    view = await operation_view(runtime.reader, operation_id)
    if view is None or not admin.may_act_in(view.tenant):
        return problem_response("not-found", f"no operation {operation_id}")
    fingerprint_ = None
    if bytes(body.request) not in (b"", b"null"):
        spec = runtime.routes.get(view.route)
        if spec is None:
            return problem_response("validation-error", f"route {view.route} has no schema")
        try:
            edited = msgspec.json.decode(bytes(body.request), type=spec.body_type)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return problem_response("validation-error", f"request: {exc}")
        fingerprint_ = fingerprint(spec.route, {}, edited)

    async def is_live(scope: Scope) -> bool:
        return await runtime.leases.holder(scope.lease_name()) is not None

    decision = await runtime.store.supersede(
        operation_id,
        reason=body.reason,
        admin_id=admin.id,
        request_fingerprint=fingerprint_,
        rebind=body.rebind,
        force=body.force,
        external=view.route in runtime.external_routes,
        is_live=is_live,
    )
    if isinstance(decision, Refuse):
        if decision.reason is RefuseReason.OUTCOME_UNKNOWN_NEEDS_FORCE:
            return problem_response(
                "supersede-needs-force",
                "the previous epoch's external effect may have happened (its outcome is "
                "unknown) and a new epoch uses a new sink key: pass force: true to accept "
                "that it may happen twice",
                operation_id=str(operation_id),
                state=view.state,
            )
        if decision.reason is RefuseReason.LIVE_ATTEMPT:
            return problem_response(
                "operation-in-progress",
                "an attempt holds a live lease; pass force: true to fence it out",
                operation_id=str(operation_id),
                state="in_progress",
            )
        return problem_response(
            "supersede-needs-force",
            "the operation is completed: superseding it lets the effect run again; "
            "pass force: true to do that",
            operation_id=str(operation_id),
            state="completed",
        )
    if decision.fenced_live_attempt:
        scope = Scope(view.tenant, view.principal_id, view.route, view.key)
        await runtime.leases.revoke(scope.lease_name())
    after = await operation_view(runtime.reader, operation_id)
    assert after is not None
    result = Superseded(
        operation=after,
        effect_may_run_again=decision.reran_completed
        or (view.route in runtime.external_routes and view.state in ("unknown", "in_progress")),
        fenced_live_attempt=decision.fenced_live_attempt,
    )
    return Response(content=msgspec.json.encode(result), media_type="application/json")


WORK_STATES = ("unknown", "conflict", "in_progress")
# Largest page of the work list.
MAX_PAGE = 100


@get("/admin/v1/operations", summary="Reconciliation work list (admin)")
async def list_work(
    request: Request[Any, Any, Any],
    state: State,
    op_state: Annotated[str, QueryParameter(name="state")],
    tenant: FromQuery[str | None] = None,
    limit: FromQuery[int] = 50,
    after: FromQuery[str | None] = None,
) -> Response[bytes]:
    admin = await authenticate(request)
    require_role(admin, Role.ADMIN)
    if op_state not in WORK_STATES:
        return problem_response("validation-error", f"state must be one of {WORK_STATES}")
    if not 1 <= limit <= MAX_PAGE:
        return problem_response("validation-error", f"limit must be 1-{MAX_PAGE}")
    if tenant is None and not admin.all_tenants:
        tenant = admin.tenant
    if tenant is not None:
        _admin_of(admin, tenant)
    try:
        page = await list_operations(
            state.runtime.reader, state=op_state, tenant=tenant, limit=limit, after=after
        )
    except BadCursor as exc:
        return problem_response("validation-error", str(exc))
    return Response(content=msgspec.json.encode(page), media_type="application/json")
