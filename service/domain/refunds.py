"""Refunds: all or part of a completed transfer, moved back from its destination to its source.

A local effect like a transfer (:mod:`service.domain.ledger`): SQL that rides in its
settlement's statement, with a guard (its one rule set, a ``CASE`` naming the problem that
refuses it) and its writes. Its table, ``refunds`` (one row per refund, per operation and
reservation epoch, like a transfer), is declared here, with the effect; what was refunded of
a transfer is the transfer row's ``refunded``, held to its amount by a CHECK.

Never more than the transfer, across any number of refunds and concurrent retries: the guard
locks the transfer's row, then both accounts (in ascending id order, as a transfer does), and
judges the latest committed versions of those rows (PostgreSQL re-reads a row it waited for);
the writes set the values the guard computed (``refunded``, both balances), so the rows
checked and written are the ones it judged. Two refunds of one transfer thus run one after
the other, each seeing what the other refunded.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

import msgspec
from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    UniqueConstraint,
    bindparam,
    case,
    exists,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.sql.selectable import CTE

from service.domain.currencies import ISO_4217
from service.domain.ledger import MAX_AMOUNT, MEMO_LIMIT, NO_NUL, Amount, Currency, refuse
from service.store.outcomes import EffectSql
from service.store.tables import accounts, citus, metadata, transfers

__all__ = [
    "REFUND",
    "REFUSALS",
    "Refund",
    "RefundRequest",
    "refund_values",
    "refunds",
]

refunds = Table(
    "refunds",
    metadata,
    Column("tenant", String(128), nullable=False),
    Column("id", UUID(as_uuid=True), nullable=False),
    # the operation that made it: kept after retention purges the operation (no foreign key)
    Column("operation_id", UUID(as_uuid=True), nullable=False),
    # one refund per operation and reservation epoch: a forced supersede may run it again
    Column("binding_generation", Integer, nullable=False),
    Column("transfer_id", UUID(as_uuid=True), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("currency", String(3), nullable=False),
    Column("memo", String(MEMO_LIMIT)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    PrimaryKeyConstraint("tenant", "id"),
    UniqueConstraint("tenant", "operation_id", "binding_generation"),
    CheckConstraint("amount > 0", name="amount_positive"),
    CheckConstraint("currency ~ '^[A-Z]{3}$'", name="currency"),
    info=citus("distributed"),
)

# the problem types the refund's guard may refuse with (service.problem_types)
REFUSALS = (
    "transfer-not-found",
    "account-not-found",
    "currency-mismatch",
    "transfer-not-refundable",
    "refund-exceeds-transfer",
    "insufficient-funds",
    "balance-limit",
)


class RefundRequest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Refund ``amount`` of transfer ``transfer`` (in its currency) to its source account."""

    transfer: uuid.UUID
    amount: Amount
    currency: Currency
    memo: Annotated[str, msgspec.Meta(max_length=MEMO_LIMIT, pattern=NO_NUL)] | None = None

    def __post_init__(self) -> None:
        if self.currency not in ISO_4217:
            raise ValueError(f"unknown currency {self.currency!r} (ISO 4217)")


class Refund(msgspec.Struct, frozen=True):
    id: uuid.UUID
    transfer: uuid.UUID
    amount: int
    currency: str
    memo: str | None
    created_at: datetime


_TRANSFER = bindparam("e_transfer", type_=transfers.c.id.type)
_AMOUNT = bindparam("e_amount", type_=accounts.c.balance.type)
_CURRENCY = bindparam("e_currency", type_=transfers.c.currency.type)
_TENANT = bindparam("e_tenant", type_=transfers.c.tenant.type)


def _guard() -> CTE:
    """The transfer's row, then both accounts, locked; then the verdict on them."""
    moved = (
        select(
            transfers.c.id,
            transfers.c.source_id,
            transfers.c.destination_id,
            transfers.c.amount,
            transfers.c.refunded,
            transfers.c.currency,
        )
        .where(transfers.c.id == _TRANSFER, transfers.c.tenant == _TENANT)
        .with_for_update()
        .cte("refunded_transfer")
    )
    ends = select(moved.c.source_id).union_all(select(moved.c.destination_id))
    locked = (
        select(accounts.c.id, accounts.c.currency, accounts.c.balance)
        .where(accounts.c.id.in_(ends), accounts.c.tenant == _TENANT)
        .order_by(accounts.c.id)
        .with_for_update()
        .cte("refund_accounts")
    )
    source, destination = locked.alias("s"), locked.alias("d")
    left = moved.c.amount - moved.c.refunded
    limit = bindparam("e_limit", type_=accounts.c.balance.type)
    refusal = case(
        (moved.c.id.is_(None), refuse("transfer-not-found", "transfer ", _TRANSFER, " not found")),
        (
            source.c.id.is_(None) | destination.c.id.is_(None),
            refuse("account-not-found", "an account of transfer ", _TRANSFER, " is gone"),
        ),
        (
            (moved.c.currency != _CURRENCY)
            | (source.c.currency != _CURRENCY)
            | (destination.c.currency != _CURRENCY),
            refuse(
                "currency-mismatch",
                "the transfer is in ",
                moved.c.currency,
                ", the refund in ",
                _CURRENCY,
            ),
        ),
        (
            left <= literal_column("0", BigInteger),
            refuse("transfer-not-refundable", "transfer ", _TRANSFER, " is refunded in full"),
        ),
        (
            left < _AMOUNT,
            refuse(
                "refund-exceeds-transfer", "the amount ", _AMOUNT, " exceeds the ", left, " left"
            ),
        ),
        (
            destination.c.balance < _AMOUNT,
            refuse(
                "insufficient-funds",
                "destination balance ",
                destination.c.balance,
                " is below the amount ",
                _AMOUNT,
            ),
        ),
        (
            source.c.balance + _AMOUNT > limit,
            refuse("balance-limit", "the source balance would exceed the limit"),
        ),
    )
    one = select(literal_column("1").label("one")).subquery("one")
    return (
        select(
            refusal.label("refusal"),
            moved.c.source_id,
            moved.c.destination_id,
            (moved.c.refunded + _AMOUNT).label("refunded_after"),
            (source.c.balance + _AMOUNT).label("source_after"),
            (destination.c.balance - _AMOUNT).label("destination_after"),
        )
        .select_from(
            one.outerjoin(moved, literal_column("true"))
            .outerjoin(source, source.c.id == moved.c.source_id)
            .outerjoin(destination, destination.c.id == moved.c.destination_id)
        )
        .cte("verdict")
    )


def _apply(written: CTE, effect_ok: CTE) -> tuple[CTE, ...]:
    """Debit the destination, credit the source, count the refund on the transfer (each to
    the value the guard computed), and the refund's row."""
    settled = exists(select(written.c.id))
    debit = (
        update(accounts)
        .where(
            accounts.c.id == select(effect_ok.c.destination_id).scalar_subquery(),
            accounts.c.tenant == _TENANT,
            settled,
        )
        .values(balance=select(effect_ok.c.destination_after).scalar_subquery())
        .cte("refund_debit")
    )
    credit = (
        update(accounts)
        .where(
            accounts.c.id == select(effect_ok.c.source_id).scalar_subquery(),
            accounts.c.tenant == _TENANT,
            settled,
        )
        .values(balance=select(effect_ok.c.source_after).scalar_subquery())
        .cte("refund_credit")
    )
    counted = (
        update(transfers)
        .where(transfers.c.id == _TRANSFER, transfers.c.tenant == _TENANT, settled)
        .values(refunded=select(effect_ok.c.refunded_after).scalar_subquery())
        .cte("refund_counted")
    )
    made = (
        insert(refunds)
        .from_select(
            [
                "tenant",
                "id",
                "operation_id",
                "binding_generation",
                "transfer_id",
                "amount",
                "currency",
                "memo",
                "created_at",
            ],
            select(
                _TENANT,
                bindparam("e_refund_id", type_=refunds.c.id.type),
                bindparam("e_operation_id", type_=refunds.c.operation_id.type),
                bindparam("e_binding_generation", type_=refunds.c.binding_generation.type),
                _TRANSFER,
                _AMOUNT,
                _CURRENCY,
                bindparam("e_memo", type_=refunds.c.memo.type),
                bindparam("e_created_at", type_=refunds.c.created_at.type),
            ).where(settled),
        )
        .cte("refund_made")
    )
    return debit, credit, counted, made


REFUND = EffectSql("refund", guard=_guard, apply=_apply)


def refund_values(
    tenant: str, operation_id: uuid.UUID, binding_generation: int, request: RefundRequest
) -> tuple[dict[str, object], Refund]:
    """Refund ``amount`` of a transfer: (the values of :data:`REFUND`'s parameters, the
    refund made when the guard lets it through). Refusals: :data:`REFUSALS`."""
    made = Refund(
        id=uuid.uuid4(),
        transfer=request.transfer,
        amount=request.amount,
        currency=request.currency,
        memo=request.memo,
        created_at=datetime.now(UTC),
    )
    params: dict[str, object] = {
        "e_tenant": tenant,
        "e_transfer": request.transfer,
        "e_amount": request.amount,
        "e_currency": request.currency,
        "e_limit": MAX_AMOUNT,
        "e_refund_id": made.id,
        "e_operation_id": operation_id,
        "e_binding_generation": binding_generation,
        "e_memo": request.memo,
        "e_created_at": made.created_at,
    }
    return params, made
