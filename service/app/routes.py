"""The idempotent routes: where a new one is declared (its scope name, schema and effect)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from service.app.effects import ExecutionContext, IdempotentRoute, Outcome
from service.core import ReservationTuple
from service.domain import ledger
from service.domain.payouts import (
    PAYOUT_ROUTE,
    PayoutRequest,
    ProviderClient,
    ProviderUnavailable,
)
from service.evidence import SignedEvidence
from service.store.outcomes import EffectSql

__all__ = ["ACCOUNTS", "TRANSFERS", "payouts"]


def _create_account_statement(
    ctx: ExecutionContext, body: ledger.AccountRequest
) -> tuple[EffectSql, Mapping[str, object], Outcome]:
    effect, params, account = ledger.create_account_statement(
        ctx.principal.tenant, ctx.operation_id, ctx.binding_generation, body
    )
    return effect, params, Outcome(status=201, body=msgspec.json.encode(account))


def _transfer_statement(
    ctx: ExecutionContext, body: ledger.TransferRequest
) -> tuple[EffectSql, Mapping[str, object], Outcome]:
    effect, params, made = ledger.transfer_statement(
        ctx.principal.tenant, ctx.operation_id, ctx.binding_generation, body
    )
    return effect, params, Outcome(status=201, body=msgspec.json.encode(made))


ACCOUNTS = IdempotentRoute(
    route="POST /v1/accounts",
    body_type=ledger.AccountRequest,
    statement=_create_account_statement,
)
TRANSFERS = IdempotentRoute(
    route="POST /v1/transfers",
    body_type=ledger.TransferRequest,
    statement=_transfer_statement,
)


def payouts(provider: ProviderClient | None) -> IdempotentRoute:
    """``POST /v1/payouts``: an external effect through the downstream provider."""

    async def pay(
        ctx: ExecutionContext, reservation: ReservationTuple, body: PayoutRequest
    ) -> SignedEvidence:
        if provider is None:
            raise ProviderUnavailable("no provider is configured (SETTLEMENT_PROVIDER_URL)")
        return await provider.pay(reservation, body)

    return IdempotentRoute(route=PAYOUT_ROUTE, body_type=PayoutRequest, external=pay)
