"""POST /v1/observations: observers deliver signed evidence of outcomes.

The signature is checked first (constant time); the reservation tuple is taken only from
verified evidence. Evidence that does not verify is recorded as a quarantined observation
and answered 422; an operation that does not exist (or is another tenant's) is recorded and
answered 404.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.datastructures import State

from service.core import Source
from service.evidence import SignedEvidence, observation_of, verify
from service.http.auth import authenticate, require_role
from service.http.problems import problem_response
from service.store.principals import Role
from service.store.settlement import OperationNotFound

__all__ = ["post_observation"]


class OperationSummary(msgspec.Struct):
    id: uuid.UUID
    state: str
    revision: int
    binding_generation: int


class Accepted(msgspec.Struct):
    disposition: str
    reason: str
    operation: OperationSummary


@post("/v1/observations", status_code=202, summary="Deliver signed evidence (observer)")
async def post_observation(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    runtime = state.runtime
    principal = await authenticate(request)
    require_role(principal, Role.OBSERVER)
    try:
        signed = msgspec.json.decode(await request.body(), type=SignedEvidence)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return problem_response("validation-error", str(exc))
    secret = runtime.settings.provider_secret
    verified = bool(secret) and verify(signed, secret)
    operation_id = signed.evidence.operation_id
    observation = observation_of(signed.evidence, Source.EVIDENCE, verified=verified)
    detail = {"principal_id": str(principal.id)}
    if not verified:  # recorded without touching (or locking) the operation row
        await runtime.store.record_refused(operation_id, observation, "unverified-evidence", detail)
        return problem_response(
            "invalid-evidence", "the evidence signature does not verify; recorded as quarantined"
        )
    owner = await runtime.store.owner_of(operation_id)
    if (
        owner is None
        or not principal.may_act_in(owner[0])
        or owner[1] not in runtime.external_routes  # evidence speaks only of external effects
    ):
        await runtime.store.record_refused(operation_id, observation, "unknown-operation", detail)
        return problem_response("not-found", f"no operation {operation_id} with external evidence")
    try:
        settled = await runtime.store.settle(operation_id, observation, detail=detail)
    except OperationNotFound:
        return problem_response("not-found", f"no operation {operation_id}")
    record = settled.record
    accepted = Accepted(
        disposition=settled.decision.disposition.value,
        reason=settled.decision.reason.value,
        operation=OperationSummary(
            id=operation_id,
            state=record.state.value,
            revision=record.revision,
            binding_generation=record.tuple.binding_generation,
        ),
    )
    return Response(
        content=msgspec.json.encode(accepted), status_code=202, media_type="application/json"
    )
