"""POST /v1/payouts: an idempotent external effect through the downstream provider."""

from __future__ import annotations

from typing import Any

from litestar import Request, post
from litestar.params import JSONBody
from litestar.response.base import ASGIResponse

from service.app.effects import served_at
from service.app.root import Settlement
from service.domain.payouts import PAYOUT_ROUTE, PayoutRequest
from service.http.bodies import StrictJson
from service.http.deps import Services
from service.http.idempotent import (
    IDEMPOTENT_DESCRIPTION,
    IdempotencyKey,
    Prefer,
    answer,
    idempotent_opt,
    identify_caller,
)

__all__ = ["post_payout"]


def _off(settlement: Settlement) -> str | None:
    """Why payouts are off on this server, if they are."""
    if settlement.provider is not None:
        return None
    return (
        "payouts are off on this server: no provider is configured "
        "(SETTLEMENT_PROVIDER_URL, SETTLEMENT_PROVIDER_SECRET)"
    )


@post(
    served_at(PAYOUT_ROUTE),
    status_code=201,
    operation_id="createPayout",
    summary="Pay out through the provider (idempotent)",
    description=IDEMPOTENT_DESCRIPTION,
    before_request=identify_caller,
    dto=StrictJson[PayoutRequest],
    return_dto=None,
    opt=idempotent_opt(lambda settlement: settlement.payouts, off=_off),
)
async def post_payout(
    request: Request[Any, Any, Any],
    settlement: Services,
    data: JSONBody[PayoutRequest],
    idempotency_key: IdempotencyKey,
    prefer: Prefer = "",
) -> ASGIResponse:
    return await answer(request, settlement, data, prefer)
