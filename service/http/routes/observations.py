"""POST /v1/observations: observers deliver signed evidence of outcomes (role observer)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from service.evidence import SignedEvidence
from service.http.auth import authenticate, require_role
from service.http.bodies import decode_json
from service.http.deps import Services
from service.http.problems import ProblemError, problem_response
from service.http.render import render_json_or_problem
from service.store.principals import Role

__all__ = ["post_observation"]


@post(
    "/v1/observations",
    status_code=202,
    operation_id="postObservation",
    summary="Deliver signed evidence (observer)",
)
async def post_observation(
    request: Request[Any, Any, Any], settlement: Services
) -> Response[bytes]:
    principal = await authenticate(request, settlement.principals)
    require_role(principal, Role.OBSERVER)
    try:
        signed = decode_json(
            await request.body(), SignedEvidence, request.headers.get("content-type")
        )
    except ProblemError as exc:
        return problem_response(exc.slug, exc.detail)
    return render_json_or_problem(
        await settlement.evidence.deliver(principal, signed), status_code=202
    )
