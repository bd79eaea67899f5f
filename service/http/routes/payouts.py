"""POST /v1/payouts: an idempotent external effect through the downstream provider."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post
from litestar.datastructures import State

from service.core import ReservationTuple
from service.domain.payouts import PayoutRequest, ProviderUnavailable
from service.evidence import SignedEvidence
from service.http.idempotency import ExecutionContext, IdempotentRoute
from service.http.problems import problem_response

__all__ = ["post_payout"]


def payouts_route(runtime: Any) -> IdempotentRoute:
    async def pay(
        ctx: ExecutionContext, reservation: ReservationTuple, body: PayoutRequest
    ) -> SignedEvidence:
        if runtime.provider is None:
            raise ProviderUnavailable("no provider is configured (SETTLEMENT_PROVIDER_URL)")
        signed: SignedEvidence = await runtime.provider.pay(reservation, body)
        return signed

    return IdempotentRoute(route="POST /v1/payouts", body_type=PayoutRequest, external=pay)


@post("/v1/payouts", status_code=201, summary="Pay out through the provider (idempotent)")
async def post_payout(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    runtime = state.runtime
    if runtime.provider is None:
        return problem_response(
            "service-unavailable",
            "no payout provider is configured "
            "(SETTLEMENT_PROVIDER_URL, SETTLEMENT_PROVIDER_SECRET)",
        )
    response: Response[bytes] = await runtime.idempotency.handle(request, runtime.payouts)
    return response
