"""The idempotent routes, each declared once: :data:`ROUTES`.

An entry is an :class:`~service.app.effects.IdempotentRoute`: its scope name and path, its
operationId, request and answer types, its effect and the business failures it may end in.
From this list come the Litestar handlers (``service.http.idempotent.idempotent_handlers``),
``Settlement.routes``, the OpenAPI operations (``service.http.contract``) and, through the
document, the client's methods and models (``clients/python/scripts/generate_models.py``).
Adding a route is one entry here, beside its domain module (the effect) and its migration.
"""

from __future__ import annotations

from service.app.effects import ExecutionContext, IdempotentRoute, LocalStatement
from service.core import ReservationTuple
from service.domain import ledger, refunds
from service.domain.payouts import (
    PAYOUT_ROUTE,
    Payout,
    PayoutRequest,
    ProviderUnavailable,
)
from service.evidence import SignedEvidence
from service.store.feed_tables import metadata

__all__ = ["ACCOUNTS", "PAYOUTS", "REFUNDS", "ROUTES", "SCHEMA", "TRANSFERS"]


async def _pay(
    ctx: ExecutionContext, reservation: ReservationTuple, body: PayoutRequest
) -> SignedEvidence:
    if ctx.provider is None:
        raise ProviderUnavailable("no provider is configured (SETTLEMENT_PROVIDER_URL)")
    return await ctx.provider.pay(reservation, body)


ACCOUNTS = IdempotentRoute(
    route="POST /v1/accounts",
    operation_id="createAccount",
    summary="Open an account (idempotent)",
    body_type=ledger.AccountRequest,
    answer_type=ledger.Account,
    statement=LocalStatement(ledger.OPEN_ACCOUNT, ledger.create_account_values),
)
TRANSFERS = IdempotentRoute(
    route="POST /v1/transfers",
    operation_id="createTransfer",
    summary="Move money between accounts (idempotent)",
    body_type=ledger.TransferRequest,
    answer_type=ledger.Transfer,
    statement=LocalStatement(ledger.TRANSFER, ledger.transfer_values),
    refusals=ledger.TRANSFER_REFUSALS,
)
PAYOUTS = IdempotentRoute(
    route=PAYOUT_ROUTE,
    operation_id="createPayout",
    summary="Pay out through the provider (idempotent)",
    body_type=PayoutRequest,
    answer_type=Payout,
    external=_pay,
    refusals=("payout-declined",),
)
REFUNDS = IdempotentRoute(
    route="POST /v1/refunds",
    operation_id="createRefund",
    summary="Refund all or part of a transfer to its source (idempotent)",
    body_type=refunds.RefundRequest,
    answer_type=refunds.Refund,
    statement=LocalStatement(refunds.REFUND, refunds.refund_values),
    refusals=refunds.REFUSALS,
)

# The order of the OpenAPI document's operations and of the client's methods.
ROUTES: tuple[IdempotentRoute, ...] = (ACCOUNTS, TRANSFERS, PAYOUTS, REFUNDS)

# Every table: the store's own (service.store.tables, service.store.feed_tables) and those an
# effect declares beside itself (service.domain.refunds), registered on the same metadata by
# the imports above. The migrations are checked against this.
SCHEMA = metadata
