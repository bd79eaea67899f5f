"""The status resource: what happened to operation X? Owner or tenant admin only."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from service.http.auth import authenticate
from service.http.problems import problem_response
from service.store.principals import Principal, Role
from service.store.status import OperationView, find_by_key, operation_view

__all__ = ["get_operation", "get_operation_by_key"]


def _may_read(principal: Principal, view: OperationView) -> bool:
    if view.principal_id == principal.id:
        return True
    return principal.role is Role.ADMIN and principal.may_act_in(view.tenant)


def _respond(principal: Principal, view: OperationView | None, what: str) -> Response[bytes]:
    if view is None or not _may_read(principal, view):
        return problem_response("not-found", f"no operation {what}")
    return Response(content=msgspec.json.encode(view), media_type="application/json")


@get("/v1/operations/{operation_id:uuid}", summary="Status of an operation")
async def get_operation(
    request: Request[Any, Any, Any], state: State, operation_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    principal = await authenticate(request)
    view = await operation_view(state.runtime.reader, operation_id)
    return _respond(principal, view, str(operation_id))


@get("/v1/operations", summary="Status of your operation under an idempotency key")
async def get_operation_by_key(
    request: Request[Any, Any, Any],
    state: State,
    key: FromQuery[str],
    route: FromQuery[str | None] = None,
) -> Response[bytes]:
    principal = await authenticate(request)
    if not 1 <= len(key) <= 255 or "\x00" in key or (route is not None and "\x00" in route):
        return problem_response("validation-error", "key must be 1-255 characters, no NUL")
    if route is not None and len(route) > 256:
        return problem_response("validation-error", "route must be at most 256 characters")
    view = await find_by_key(state.runtime.reader, principal.tenant, principal.id, key, route)
    return _respond(principal, view, f"with key {key!r}")
