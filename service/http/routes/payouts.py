"""POST /v1/payouts: an idempotent external effect through the downstream provider."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, post

from service.app.root import Settlement
from service.http.auth import AuthError, authenticate, require_role
from service.http.deps import Services
from service.http.idempotent import IDEMPOTENT_DESCRIPTION, answer_idempotent
from service.http.keys import IdempotencyKeyError, parse_idempotency_key
from service.http.problems import problem_reply
from service.http.render import stamp_idempotency_headers
from service.http.reply import LANE_ANSWER, Call, Reply, to_response
from service.store.principals import Role

__all__ = ["answer_payout", "post_payout"]

# who may call POST /v1/payouts (the IdempotentRoute's default roles)
PAYOUT_ROLES = (Role.CLIENT, Role.ADMIN)


async def answer_payout(call: Call, settlement: Settlement) -> Reply:
    """POST /v1/payouts's answer, for Litestar's router and the idempotent lane alike."""
    if settlement.provider is None:  # a route this server does not offer, not an outage
        # the request's own checks first, in the order of every idempotent route: only a
        # well-formed request of a caller who may pay out learns that
        try:
            require_role(await authenticate(call, settlement.principals), *PAYOUT_ROLES)
            parse_idempotency_key(call.headers.getall("idempotency-key", []))
        except (AuthError, IdempotencyKeyError) as exc:
            return stamp_idempotency_headers(problem_reply(exc.slug, exc.detail))
        off = problem_reply(
            "not-found",
            "payouts are off on this server: no provider is configured "
            "(SETTLEMENT_PROVIDER_URL, SETTLEMENT_PROVIDER_SECRET)",
        )
        return stamp_idempotency_headers(off)
    return await answer_idempotent(call, settlement, settlement.payouts)


@post(
    "/v1/payouts",
    status_code=201,
    operation_id="createPayout",
    summary="Pay out through the provider (idempotent)",
    description=IDEMPOTENT_DESCRIPTION,
    opt={LANE_ANSWER: answer_payout},
)
async def post_payout(request: Request[Any, Any, Any], settlement: Services) -> Response[bytes]:
    return to_response(await answer_payout(request, settlement))
