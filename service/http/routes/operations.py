"""The status resource: what happened to operation X? Owner or tenant admin only."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery

from service.http.auth import authenticate
from service.http.problems import problem_response
from service.leases import LeaseUnavailable
from service.store.principals import Principal, Role
from service.store.rows import Scope
from service.store.status import OperationView, find_by_key, operation_view

__all__ = ["get_operation", "get_operation_by_key"]

# A lease key without an expiry would read as infinite; no lease is shown as longer than a day.
MAX_SHOWN_LEASE = 86_400.0


def _may_read(principal: Principal, view: OperationView) -> bool:
    if view.principal_id == principal.id:
        return True
    return principal.role is Role.ADMIN and principal.may_act_in(view.tenant)


async def _respond(
    runtime: Any, principal: Principal, view: OperationView | None, what: str
) -> Response[bytes]:
    if view is None or not _may_read(principal, view):
        return problem_response("not-found", f"no operation {what}")
    if view.lease is not None:
        view.lease.expires_at = await _lease_expiry(runtime, view)
    return Response(content=msgspec.json.encode(view), media_type="application/json")


async def _lease_expiry(runtime: Any, view: OperationView) -> datetime | None:
    """Heartbeats extend the lease in Redis, not in the row: show Redis's view (None when the
    lease is gone); fall back to the row's claim-time value if Redis cannot be asked."""
    assert view.lease is not None
    scope = Scope(view.tenant, view.principal_id, view.route, view.key)
    try:
        remaining = await runtime.leases.remaining(scope.lease_name())
    except LeaseUnavailable:
        return view.lease.expires_at
    if remaining is None:
        return None
    return datetime.now(UTC) + timedelta(seconds=min(remaining, MAX_SHOWN_LEASE))


@get("/v1/operations/{operation_id:uuid}", summary="Status of an operation")
async def get_operation(
    request: Request[Any, Any, Any], state: State, operation_id: FromPath[uuid.UUID]
) -> Response[bytes]:
    principal = await authenticate(request)
    view = await operation_view(state.runtime.reader, operation_id)
    return await _respond(state.runtime, principal, view, str(operation_id))


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
    return await _respond(state.runtime, principal, view, f"with key {key!r}")
