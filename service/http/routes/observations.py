"""POST /v1/observations: observers deliver signed evidence of outcomes (role observer)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.params import JSONBody

from service.domain.principals import Role
from service.evidence import SignedEvidence
from service.http.bodies import StrictJson
from service.http.deps import Services
from service.http.guards import caller, caller_of
from service.http.render import render_json_or_problem

__all__ = ["post_observation"]


@post(
    "/v1/observations",
    status_code=202,
    operation_id="postObservation",
    summary="Deliver signed evidence (observer)",
    guards=[caller(Role.OBSERVER, body=True)],
    dto=StrictJson[SignedEvidence],
    return_dto=None,
)
async def post_observation(
    request: Request[Any, Any, Any], settlement: Services, data: JSONBody[SignedEvidence]
) -> Response[bytes]:
    delivered = await settlement.evidence.deliver(caller_of(request), data)
    return render_json_or_problem(delivered, status_code=202)
