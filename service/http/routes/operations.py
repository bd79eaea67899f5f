"""The status resource: what happened to operation X? Owner or tenant admin only."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Request, Response, get
from litestar.params import FromPath, QueryParameter

from service.app.status import MAX_OBSERVATION_ID
from service.http.auth import authenticate
from service.http.deps import Services
from service.http.problems import problem_response
from service.http.query import refuse_undeclared_query
from service.http.render import render_json_or_problem

__all__ = ["get_operation", "get_operation_by_key"]

# PostgreSQL text cannot hold U+0000
NO_NUL = "^[^\x00]*$"

# ?observations_before=<id>: the page of observations older than it (the answer's
# older_observations names the next one); the settling observation is on every page
ObservationsBefore = Annotated[
    int | None,
    QueryParameter(
        ge=1,
        le=MAX_OBSERVATION_ID,
        description="list the observations older than this observation id (the previous "
        "answer's older_observations); unset: the newest",
    ),
]


@get(
    "/v1/operations/{operation_id:uuid}",
    operation_id="getOperation",
    summary="Status of an operation",
)
async def get_operation(
    request: Request[Any, Any, Any],
    settlement: Services,
    operation_id: FromPath[uuid.UUID],
    observations_before: ObservationsBefore = None,
) -> Response[bytes]:
    principal = await authenticate(request, settlement.principals)
    refuse_undeclared_query(request)
    return render_json_or_problem(
        await settlement.status.by_id(principal, operation_id, observations_before)
    )


@get(
    "/v1/operations",
    operation_id="findOperationByKey",
    summary="Status of your operation under an idempotency key",
)
async def get_operation_by_key(
    request: Request[Any, Any, Any],
    settlement: Services,
    key: Annotated[str, QueryParameter(min_length=1, max_length=255, pattern=NO_NUL)],
    route: Annotated[str | None, QueryParameter(max_length=256, pattern=NO_NUL)] = None,
    observations_before: ObservationsBefore = None,
) -> Response[bytes]:
    principal = await authenticate(request, settlement.principals)
    refuse_undeclared_query(request)
    if not 1 <= len(key) <= 255 or "\x00" in key or (route is not None and "\x00" in route):
        return problem_response("validation-error", "key must be 1-255 characters, no NUL")
    if route is not None and len(route) > 256:
        return problem_response("validation-error", "route must be at most 256 characters")
    return render_json_or_problem(
        await settlement.status.by_key(principal, key, route, observations_before)
    )
