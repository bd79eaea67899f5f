"""The contract's operations as :class:`Request` values (shared by the sync and async
clients), and the body type each answers with."""

from __future__ import annotations

import uuid
from typing import Any, Literal
from urllib.parse import quote

import msgspec

from ._call import Request
from .models import (
    Account,
    AccountRequest,
    Payout,
    PayoutRequest,
    PrincipalRequest,
    SupersedeBody,
    Transfer,
    TransferRequest,
)

__all__ = ["ANSWERS", "ROUTES", "idempotent", "new_key"]

Kind = Literal["account", "transfer", "payout"]
# an intended action's kind -> its route and the body of its 201
ROUTES: dict[str, str] = {
    "account": "/v1/accounts",
    "transfer": "/v1/transfers",
    "payout": "/v1/payouts",
}
ANSWERS: dict[str, type[Any]] = {"account": Account, "transfer": Transfer, "payout": Payout}
_encode = msgspec.json.Encoder()


def new_key() -> str:
    """A fresh Idempotency-Key: a random UUID (version 4)."""
    return str(uuid.uuid4())


def idempotent(kind: str, body: Any, key: str | None, prefer_wait: int) -> Request:
    return Request(
        "POST",
        ROUTES[kind],
        body=_encode.encode(body),
        key=key if key is not None else new_key(),
        prefer_wait=prefer_wait,
    )


def account(currency: str, opening_balance: int) -> AccountRequest:
    return AccountRequest(currency=currency, opening_balance=opening_balance)


def transfer(
    source: str, destination: str, amount: int, currency: str, memo: str | None
) -> TransferRequest:
    return TransferRequest(
        source=source, destination=destination, amount=amount, currency=currency, memo=memo
    )


def payout(beneficiary: str, amount: int, currency: str) -> PayoutRequest:
    return PayoutRequest(beneficiary=beneficiary, amount=amount, currency=currency)


def get(path: str, params: dict[str, str] | None = None) -> Request:
    return Request("GET", path, params=params)


def segment(value: str) -> str:
    return quote(value, safe="")


def principal(tenant: str, name: str, role: Literal["admin", "client", "observer"]) -> Request:
    body = PrincipalRequest(tenant=tenant, name=name, role=role)
    return Request("POST", "/admin/v1/principals", body=_encode.encode(body))


def supersede(operation_id: str, reason: str, request: Any, rebind: bool, force: bool) -> Request:
    body = SupersedeBody(reason=reason, request=request, rebind=rebind, force=force)
    return Request(
        "POST",
        f"/admin/v1/operations/{segment(operation_id)}/supersede",
        body=_encode.encode(body),
    )


def work(state: str, tenant: str | None, limit: int | None, after: str | None) -> Request:
    params = {"state": state}
    params |= {"tenant": tenant} if tenant else {}
    params |= {"limit": str(limit)} if limit else {}
    params |= {"after": after} if after else {}
    return get("/admin/v1/operations", params)
