"""The server's idempotent routes as the client's actions, generated from the OpenAPI
document (openapi/openapi.json): their paths, bodies and answers, the ``create_<kind>``
methods of the sync and async clients, and ``IntendedAction.<kind>``.

Do not edit: run ``python clients/python/scripts/generate_actions.py``. A test fails when the
document changes and this module does not.
"""

from __future__ import annotations

from typing import Any, Literal, Self

import msgspec

from ._call import Answer, Request
from ._routes import new_key
from .models import (
    Account,
    AccountRequest,
    Payout,
    PayoutRequest,
    Refund,
    RefundRequest,
    Transfer,
    TransferRequest,
)
from .policy import RetryPolicy

__all__ = [
    "ANSWERS",
    "ROUTES",
    "Account",
    "ActionAnswer",
    "AsyncIdempotentCalls",
    "IdempotentCalls",
    "IntendedActions",
    "Kind",
    "Payout",
    "Refund",
    "Transfer",
    "idempotent",
]

# the kind of an intended action
Kind = Literal["account", "transfer", "payout", "refund"]
# its route
ROUTES: dict[str, str] = {
    "account": "/v1/accounts",
    "transfer": "/v1/transfers",
    "payout": "/v1/payouts",
    "refund": "/v1/refunds",
}
# the body of its success
ANSWERS: dict[str, type[Any]] = {
    "account": Account,
    "transfer": Transfer,
    "payout": Payout,
    "refund": Refund,
}
# what any action answers
ActionAnswer = Account | Transfer | Payout | Refund


_encode = msgspec.json.Encoder()


def idempotent(kind: str, body: Any, key: str | None, prefer_wait: int) -> Request:
    """The request of an action: its key, or a new one (a random UUID) when None."""
    return Request(
        "POST",
        ROUTES[kind],
        body=_encode.encode(body),
        key=key if key is not None else new_key(),
        prefer_wait=prefer_wait,
    )


class IdempotentCalls:
    """The sync client's ``create_<kind>`` methods (the client provides ``send``)."""

    __slots__ = ()

    def send(self, request: Request, kind: Any, *, policy: RetryPolicy | None = None) -> Any:
        raise NotImplementedError

    def create_account(
        self,
        currency: str,
        opening_balance: int = 0,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Account]:
        """Open an account (idempotent): ``POST /v1/accounts``."""
        body = AccountRequest(currency=currency, opening_balance=opening_balance)
        request = idempotent("account", body, key, prefer_wait)
        answer: Answer[Account] = self.send(request, Account, policy=policy)
        return answer

    def create_transfer(
        self,
        source: str,
        destination: str,
        amount: int,
        currency: str,
        memo: str | None = None,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Transfer]:
        """Move money between accounts (idempotent): ``POST /v1/transfers``."""
        body = TransferRequest(
            source=source, destination=destination, amount=amount, currency=currency, memo=memo
        )
        request = idempotent("transfer", body, key, prefer_wait)
        answer: Answer[Transfer] = self.send(request, Transfer, policy=policy)
        return answer

    def create_payout(
        self,
        beneficiary: str,
        amount: int,
        currency: str,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Payout]:
        """Pay out through the provider (idempotent): ``POST /v1/payouts``."""
        body = PayoutRequest(beneficiary=beneficiary, amount=amount, currency=currency)
        request = idempotent("payout", body, key, prefer_wait)
        answer: Answer[Payout] = self.send(request, Payout, policy=policy)
        return answer

    def create_refund(
        self,
        transfer: str,
        amount: int,
        currency: str,
        memo: str | None = None,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Refund]:
        """Refund all or part of a transfer to its source (idempotent): ``POST /v1/refunds``."""
        body = RefundRequest(transfer=transfer, amount=amount, currency=currency, memo=memo)
        request = idempotent("refund", body, key, prefer_wait)
        answer: Answer[Refund] = self.send(request, Refund, policy=policy)
        return answer


class AsyncIdempotentCalls:
    """The async client's ``create_<kind>`` methods (the client provides ``send``)."""

    __slots__ = ()

    async def send(self, request: Request, kind: Any, *, policy: RetryPolicy | None = None) -> Any:
        raise NotImplementedError

    async def create_account(
        self,
        currency: str,
        opening_balance: int = 0,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Account]:
        """Open an account (idempotent): ``POST /v1/accounts``."""
        body = AccountRequest(currency=currency, opening_balance=opening_balance)
        request = idempotent("account", body, key, prefer_wait)
        answer: Answer[Account] = await self.send(request, Account, policy=policy)
        return answer

    async def create_transfer(
        self,
        source: str,
        destination: str,
        amount: int,
        currency: str,
        memo: str | None = None,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Transfer]:
        """Move money between accounts (idempotent): ``POST /v1/transfers``."""
        body = TransferRequest(
            source=source, destination=destination, amount=amount, currency=currency, memo=memo
        )
        request = idempotent("transfer", body, key, prefer_wait)
        answer: Answer[Transfer] = await self.send(request, Transfer, policy=policy)
        return answer

    async def create_payout(
        self,
        beneficiary: str,
        amount: int,
        currency: str,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Payout]:
        """Pay out through the provider (idempotent): ``POST /v1/payouts``."""
        body = PayoutRequest(beneficiary=beneficiary, amount=amount, currency=currency)
        request = idempotent("payout", body, key, prefer_wait)
        answer: Answer[Payout] = await self.send(request, Payout, policy=policy)
        return answer

    async def create_refund(
        self,
        transfer: str,
        amount: int,
        currency: str,
        memo: str | None = None,
        *,
        key: str | None = None,
        prefer_wait: int = 0,
        policy: RetryPolicy | None = None,
    ) -> Answer[Refund]:
        """Refund all or part of a transfer to its source (idempotent): ``POST /v1/refunds``."""
        body = RefundRequest(transfer=transfer, amount=amount, currency=currency, memo=memo)
        request = idempotent("refund", body, key, prefer_wait)
        answer: Answer[Refund] = await self.send(request, Refund, policy=policy)
        return answer


class IntendedActions:
    """``IntendedAction.<kind>(...)``: an action and its key, chosen now (a new one when
    ``key`` is None)."""

    __slots__ = ()

    @classmethod
    def of(cls, kind: Kind, body: Any, key: str | None) -> Self:
        raise NotImplementedError

    @classmethod
    def account(cls, currency: str, opening_balance: int = 0, *, key: str | None = None) -> Self:
        return cls.of(
            "account", AccountRequest(currency=currency, opening_balance=opening_balance), key
        )

    @classmethod
    def transfer(
        cls,
        source: str,
        destination: str,
        amount: int,
        currency: str,
        memo: str | None = None,
        *,
        key: str | None = None,
    ) -> Self:
        return cls.of(
            "transfer",
            TransferRequest(
                source=source, destination=destination, amount=amount, currency=currency, memo=memo
            ),
            key,
        )

    @classmethod
    def payout(
        cls, beneficiary: str, amount: int, currency: str, *, key: str | None = None
    ) -> Self:
        return cls.of(
            "payout", PayoutRequest(beneficiary=beneficiary, amount=amount, currency=currency), key
        )

    @classmethod
    def refund(
        cls,
        transfer: str,
        amount: int,
        currency: str,
        memo: str | None = None,
        *,
        key: str | None = None,
    ) -> Self:
        return cls.of(
            "refund",
            RefundRequest(transfer=transfer, amount=amount, currency=currency, memo=memo),
            key,
        )
