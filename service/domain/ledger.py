"""The demo local-effect domain: accounts and transfers.

Each effect is SQL that rides in its settlement's statement
(``service.store.outcomes.EffectStatement``), so the effect's rows commit together with the
operation, attempt and observation rows, or not at all. Its guard is the effect's one rule
set: a ``CASE`` that yields why the effect may not apply (a problem slug and its detail), or
NULL. The transfer's guard locks both accounts in ascending id order, so two transfers over
the same pair of accounts cannot deadlock.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from sqlalchemy import (
    ColumnElement,
    Text,
    any_,
    bindparam,
    case,
    cast,
    exists,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, array
from sqlalchemy.sql.selectable import CTE

from service.domain.currencies import ISO_4217
from service.store.outcomes import EffectSql, never_refused
from service.store.tables import accounts, transfers

__all__ = [
    "MAX_AMOUNT",
    "MEMO_LIMIT",
    "NO_NUL",
    "OPEN_ACCOUNT",
    "TRANSFER",
    "TRANSFER_REFUSALS",
    "Account",
    "AccountRequest",
    "Amount",
    "Currency",
    "Transfer",
    "TransferRequest",
    "create_account_values",
    "refuse",
    "transfer_values",
]

# Largest amount or balance in minor units: fits PostgreSQL bigint with room for a sum.
MAX_AMOUNT = 10**15
MEMO_LIMIT = 512
# PostgreSQL text cannot hold U+0000: refuse it at validation (400), not at INSERT (500).
NO_NUL = "^[^\x00]*$"

Currency = Annotated[
    str,
    msgspec.Meta(
        pattern="^[A-Z]{3}(?!\n)$",
        description="ISO 4217 code",
        # the schema names the codes __post_init__ accepts, so a client can tell
        extra_json_schema={"enum": sorted(ISO_4217)},
    ),
]
# JSON Schema would count 100.0 as an integer; msgspec (strict) does not, nor do we
WHOLE = "minor units, written as a JSON integer (100, not 100.0)"
Amount = Annotated[int, msgspec.Meta(gt=0, le=MAX_AMOUNT, description=WHOLE)]
Balance = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT, description=WHOLE)]


class AccountRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    currency: Currency
    opening_balance: Balance = 0

    def __post_init__(self) -> None:
        _known_currency(self.currency)


class TransferRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    source: uuid.UUID
    destination: uuid.UUID
    amount: Amount
    currency: Currency
    memo: Annotated[str, msgspec.Meta(max_length=MEMO_LIMIT, pattern=NO_NUL)] | None = None

    def __post_init__(self) -> None:
        _known_currency(self.currency)
        if self.source == self.destination:
            raise ValueError("source and destination must be different accounts")


class Account(msgspec.Struct, frozen=True):
    id: uuid.UUID
    currency: str
    balance: int


class Transfer(msgspec.Struct, frozen=True):
    id: uuid.UUID
    source: uuid.UUID
    destination: uuid.UUID
    amount: int
    currency: str
    memo: str | None
    created_at: datetime


def _known_currency(code: str) -> None:
    if code not in ISO_4217:
        raise ValueError(f"unknown currency {code!r} (ISO 4217)")


# The transfer's guard judges the rows ``locked`` returns, and its writes set the balances
# the guard computed from those rows, never ``balance - amount`` of the row the UPDATE itself
# scans. In one statement every part reads the statement's snapshot; ``FOR UPDATE`` waits for
# a concurrent transfer and then returns the row version that transfer committed
# (PostgreSQL's re-check of an updated row, EvalPlanQual), but the UPDATE of the same row
# starts again from the version in the snapshot: it computes the new row from that older
# version and checks the table's CHECK constraints on it before it finds the row updated and
# recomputes. A debit of a balance that a concurrent credit had just funded thus failed the
# balance CHECK (a 500) although the guard had rightly let it through. Setting the value the
# guard computed makes the row checked and written the one the guard judged; the lock held
# since ``locked`` keeps that row the latest until the statement commits.
_SOURCE = bindparam("e_source", type_=accounts.c.id.type)
_DESTINATION = bindparam("e_destination", type_=accounts.c.id.type)
_AMOUNT = bindparam("e_amount", type_=accounts.c.balance.type)
_CURRENCY = bindparam("e_currency", type_=accounts.c.currency.type)
_TENANT = bindparam("e_tenant", type_=accounts.c.tenant.type)
_OPERATION = bindparam("e_operation_id", type_=accounts.c.operation_id.type)
_GENERATION = bindparam("e_binding_generation", type_=accounts.c.binding_generation.type)


def _text(value: Any) -> ColumnElement[str]:
    return cast(value, Text)


def _constant(words: str) -> ColumnElement[str]:
    """A text constant of the statement's own, written into its SQL (not a parameter)."""
    return literal_column("'" + words.replace("'", "''") + "'", Text)


def refuse(slug: str, *detail: Any) -> ColumnElement[Any]:
    """A refusal: ``ARRAY[slug, detail]`` (the detail's parts joined as text)."""
    words = [_constant(part) if isinstance(part, str) else _text(part) for part in detail]
    joined = words[0]
    for word in words[1:]:
        joined = joined.concat(word)
    return array([_constant(slug), joined])


def _transfer_guard() -> CTE:
    """Both accounts locked in ascending id order, then the verdict on them: the transfer's
    rules in one ``CASE``, and the balances it would leave."""
    locked = (
        select(accounts.c.id, accounts.c.currency, accounts.c.balance)
        .where(
            accounts.c.id == any_(bindparam("e_accounts", type_=ARRAY(accounts.c.id.type))),
            accounts.c.tenant == _TENANT,
        )
        .order_by(accounts.c.id)
        .with_for_update()
        .cte("locked")
    )
    source, destination = locked.alias("s"), locked.alias("d")
    limit = bindparam("e_limit", type_=accounts.c.balance.type)
    refusal = case(
        (
            source.c.id.is_(None),
            refuse("account-not-found", "source account ", _SOURCE, " not found"),
        ),
        (
            destination.c.id.is_(None),
            refuse("account-not-found", "destination account ", _DESTINATION, " not found"),
        ),
        (
            source.c.currency != _CURRENCY,
            refuse(
                "currency-mismatch",
                "source account holds ",
                source.c.currency,
                ", the transfer is in ",
                _CURRENCY,
            ),
        ),
        (
            destination.c.currency != _CURRENCY,
            refuse(
                "currency-mismatch",
                "destination account holds ",
                destination.c.currency,
                ", the transfer is in ",
                _CURRENCY,
            ),
        ),
        (
            source.c.balance < _AMOUNT,
            refuse(
                "insufficient-funds",
                "source balance ",
                source.c.balance,
                " is below the amount ",
                _AMOUNT,
            ),
        ),
        (
            destination.c.balance + _AMOUNT > limit,
            refuse("balance-limit", "the destination balance would exceed the limit"),
        ),
    )
    one = select(literal_column("1").label("one")).subquery("one")
    return (
        select(
            refusal.label("refusal"),
            (source.c.balance - _AMOUNT).label("source_after"),
            (destination.c.balance + _AMOUNT).label("destination_after"),
        )
        .select_from(
            one.outerjoin(source, source.c.id == _SOURCE).outerjoin(
                destination, destination.c.id == _DESTINATION
            )
        )
        .cte("verdict")
    )


def _transfer_apply(written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
    """Debit, credit (to the balances the guard computed) and the transfer's row."""
    settled = exists(select(written.c.id))
    debit = (
        update(accounts)
        .where(accounts.c.id == _SOURCE, accounts.c.tenant == _TENANT, settled)
        .values(balance=select(effect_ok.c.source_after).scalar_subquery())
        .cte("debit")
    )
    credit = (
        update(accounts)
        .where(accounts.c.id == _DESTINATION, accounts.c.tenant == _TENANT, settled)
        .values(balance=select(effect_ok.c.destination_after).scalar_subquery())
        .cte("credit")
    )
    moved = (
        insert(transfers)
        .from_select(
            [
                "id",
                "tenant",
                "operation_id",
                "binding_generation",
                "source_id",
                "destination_id",
                "amount",
                "currency",
                "memo",
                "created_at",
            ],
            select(
                bindparam("e_transfer_id", type_=transfers.c.id.type),
                _TENANT,
                _OPERATION,
                _GENERATION,
                _SOURCE,
                _DESTINATION,
                _AMOUNT,
                _CURRENCY,
                bindparam("e_memo", type_=transfers.c.memo.type),
                bindparam("e_created_at", type_=transfers.c.created_at.type),
            ).where(settled),
        )
        .cte("moved")
    )
    return debit, credit, moved


TRANSFER = EffectSql("transfer", guard=_transfer_guard, apply=_transfer_apply)
# the problem types the transfer's guard may refuse with (service.problem_types)
TRANSFER_REFUSALS = (
    "insufficient-funds",
    "account-not-found",
    "currency-mismatch",
    "balance-limit",
)


def transfer_values(
    tenant: str, operation_id: uuid.UUID, binding_generation: int, request: TransferRequest
) -> tuple[dict[str, object], Transfer]:
    """Move ``amount`` from source to destination: (the values of :data:`TRANSFER`'s
    parameters, the transfer made when the guard lets it through). The guard refuses with
    ``account-not-found`` (404), ``currency-mismatch``, ``balance-limit`` (422) or
    ``insufficient-funds`` (402)."""
    made = Transfer(
        id=uuid.uuid4(),
        source=request.source,
        destination=request.destination,
        amount=request.amount,
        currency=request.currency,
        memo=request.memo,
        created_at=datetime.now(UTC),
    )
    params: dict[str, object] = {
        "e_accounts": sorted((request.source, request.destination)),
        "e_tenant": tenant,
        "e_source": request.source,
        "e_destination": request.destination,
        "e_amount": request.amount,
        "e_currency": request.currency,
        "e_limit": MAX_AMOUNT,
        "e_transfer_id": made.id,
        "e_operation_id": operation_id,
        "e_binding_generation": binding_generation,
        "e_memo": request.memo,
        "e_created_at": made.created_at,
    }
    return params, made


def _account_apply(written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
    opened = (
        insert(accounts)
        .from_select(
            ["id", "tenant", "currency", "balance", "operation_id", "binding_generation"],
            select(
                bindparam("e_account_id", type_=accounts.c.id.type),
                _TENANT,
                _CURRENCY,
                bindparam("e_opening_balance", type_=accounts.c.balance.type),
                _OPERATION,
                _GENERATION,
            ).where(exists(select(written.c.id))),
        )
        .cte("opened")
    )
    return (opened,)


# nothing to lock or check: an account is always opened
OPEN_ACCOUNT = EffectSql("open-account", guard=never_refused, apply=_account_apply)


def create_account_values(
    tenant: str, operation_id: uuid.UUID, binding_generation: int, request: AccountRequest
) -> tuple[dict[str, object], Account]:
    """Open an account: (the values of :data:`OPEN_ACCOUNT`'s parameters, the account)."""
    account = Account(id=uuid.uuid4(), currency=request.currency, balance=request.opening_balance)
    params: dict[str, object] = {
        "e_account_id": account.id,
        "e_tenant": tenant,
        "e_currency": request.currency,
        "e_opening_balance": request.opening_balance,
        "e_operation_id": operation_id,
        "e_binding_generation": binding_generation,
    }
    return params, account
