"""The demo local-effect domain: accounts and transfers.

A transfer's rows and both balance updates are written on the settlement transaction's
(asyncpg) connection in two statements, so they commit together with the operation, attempt
and observation rows (or not at all). Account rows are locked in ascending id order, so two
transfers over the same pair of accounts cannot deadlock.

:func:`transfer_statement` is the same transfer as SQL the settlement's finishing statement
carries (``service.store.outcomes.EffectStatement``): the guard locks both accounts in the
same order and checks every rule :func:`transfer` checks; the writes are those of
:func:`transfer`. When the guard refuses, :func:`transfer` runs and says why.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

import asyncpg
import msgspec

from service.domain.currencies import ISO_4217

__all__ = [
    "Account",
    "AccountRequest",
    "BusinessFailure",
    "Transfer",
    "TransferRequest",
    "create_account",
    "create_account_statement",
    "get_account",
    "transfer",
    "transfer_statement",
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


class BusinessFailure(Exception):
    """A definitive business outcome: stored as ``failed`` and replayed."""

    def __init__(self, slug: str, detail: str) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail


def _known_currency(code: str) -> None:
    if code not in ISO_4217:
        raise ValueError(f"unknown currency {code!r} (ISO 4217)")


_CREATE_ACCOUNT = """
INSERT INTO accounts (id, tenant, currency, balance, operation_id, binding_generation)
VALUES ($1, $2, $3, $4, $5, $6)
"""
_GET_ACCOUNT = "SELECT id, currency, balance FROM accounts WHERE id = $1 AND tenant = $2"
# both accounts, locked in ascending id order: two transfers over one pair cannot deadlock
_LOCK_ACCOUNTS = """
SELECT id, currency, balance FROM accounts
 WHERE id = ANY($1::uuid[]) AND tenant = $2
 ORDER BY id FOR UPDATE
"""
# both balance updates and the transfer row in one statement (one round trip)
_MOVE = """
WITH debit AS (UPDATE accounts SET balance = balance - $6 WHERE id = $4),
     credit AS (UPDATE accounts SET balance = balance + $6 WHERE id = $5)
INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id,
    destination_id, amount, currency, memo, created_at)
VALUES ($1, $2, $3, $7, $4, $5, $6, $8, $9, $10)
"""


# transfer_statement's SQL: $E1 both account ids in ascending order, $E2 tenant, $E3 source,
# $E4 destination, $E5 amount, $E6 currency, $E7 the balance limit, $E8 the transfer's id,
# $E9 the operation, $E10 its binding generation, $E11 memo, $E12 created_at.
#
# The guard judges the rows ``locked`` returns, and the writes set the balances the guard
# computed from those rows, never ``balance - amount`` of the row the UPDATE itself scans.
# In one statement every part reads the statement's snapshot; ``FOR UPDATE`` waits for a
# concurrent transfer and then returns the row version that transfer committed (PostgreSQL's
# re-check of an updated row, EvalPlanQual), but the UPDATE of the same row starts again from
# the version in the snapshot: it computes the new row from that older version and checks
# the table's CHECK constraints on it before it finds the row updated and recomputes. A debit
# of a balance that a concurrent credit had just funded thus failed the balance CHECK (a 500)
# although the guard had rightly let it through. Setting the value the guard computed makes
# the row checked and written the one the guard judged; the lock held since ``locked`` keeps
# that row the latest until the statement commits.
_TRANSFER_GUARD = """
locked AS (
    SELECT id, currency, balance FROM accounts
     WHERE id = ANY($E1::uuid[]) AND tenant = $E2::varchar
     ORDER BY id FOR UPDATE
), effect_ok AS (
    SELECT s.balance - $E5::bigint AS source_after, d.balance + $E5::bigint AS destination_after
      FROM locked s, locked d
     WHERE s.id = $E3::uuid AND d.id = $E4::uuid
       AND s.currency = $E6::varchar AND d.currency = $E6::varchar
       AND s.balance >= $E5::bigint AND d.balance + $E5::bigint <= $E7::bigint
)"""
_TRANSFER_APPLY = """
debit AS (
    UPDATE accounts SET balance = (SELECT source_after FROM effect_ok)
     WHERE id = $E3::uuid AND EXISTS (SELECT 1 FROM written)
), credit AS (
    UPDATE accounts SET balance = (SELECT destination_after FROM effect_ok)
     WHERE id = $E4::uuid AND EXISTS (SELECT 1 FROM written)
), moved AS (
    INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id,
        destination_id, amount, currency, memo, created_at)
    SELECT $E8::uuid, $E2::varchar, $E9::uuid, $E10::int, $E3::uuid, $E4::uuid,
           $E5::bigint, $E6::varchar, $E11::varchar, $E12::timestamptz
     WHERE EXISTS (SELECT 1 FROM written)
)"""


def transfer_statement(
    tenant: str, operation_id: uuid.UUID, binding_generation: int, request: TransferRequest
) -> tuple[str, str, tuple[object, ...], Transfer]:
    """:func:`transfer` as SQL: (guard, writes, their ``$E<n>`` values, the transfer made when
    the guard lets it through)."""
    made = Transfer(
        id=uuid.uuid4(),
        source=request.source,
        destination=request.destination,
        amount=request.amount,
        currency=request.currency,
        memo=request.memo,
        created_at=datetime.now(UTC),
    )
    args = (
        sorted((request.source, request.destination)),
        tenant,
        request.source,
        request.destination,
        request.amount,
        request.currency,
        MAX_AMOUNT,
        made.id,
        operation_id,
        binding_generation,
        request.memo,
        made.created_at,
    )
    return _TRANSFER_GUARD, _TRANSFER_APPLY, args, made


# create_account_statement's SQL: nothing to lock or check; $E1 id, $E2 tenant, $E3 currency,
# $E4 opening balance, $E5 the operation, $E6 its binding generation
_ACCOUNT_GUARD = "effect_ok AS (SELECT 1)"
_ACCOUNT_APPLY = """
opened AS (
    INSERT INTO accounts (id, tenant, currency, balance, operation_id, binding_generation)
    SELECT $E1::uuid, $E2::varchar, $E3::varchar, $E4::bigint, $E5::uuid, $E6::int
     WHERE EXISTS (SELECT 1 FROM written)
)"""


def create_account_statement(
    tenant: str, operation_id: uuid.UUID, binding_generation: int, request: AccountRequest
) -> tuple[str, str, tuple[object, ...], Account]:
    """:func:`create_account` as SQL: (guard, writes, their ``$E<n>`` values, the account)."""
    account = Account(id=uuid.uuid4(), currency=request.currency, balance=request.opening_balance)
    args = (
        account.id,
        tenant,
        request.currency,
        request.opening_balance,
        operation_id,
        binding_generation,
    )
    return _ACCOUNT_GUARD, _ACCOUNT_APPLY, args, account


async def create_account(
    conn: asyncpg.Connection,
    tenant: str,
    operation_id: uuid.UUID,
    binding_generation: int,
    request: AccountRequest,
) -> Account:
    account_id = uuid.uuid4()
    await conn.execute(
        _CREATE_ACCOUNT,
        account_id,
        tenant,
        request.currency,
        request.opening_balance,
        operation_id,
        binding_generation,
    )
    return Account(id=account_id, currency=request.currency, balance=request.opening_balance)


async def get_account(
    conn: asyncpg.Connection, tenant: str, account_id: uuid.UUID
) -> Account | None:
    row = await conn.fetchrow(_GET_ACCOUNT, account_id, tenant)
    if row is None:
        return None
    return Account(id=row["id"], currency=row["currency"], balance=row["balance"])


async def transfer(
    conn: asyncpg.Connection,
    tenant: str,
    operation_id: uuid.UUID,
    binding_generation: int,
    request: TransferRequest,
) -> Transfer:
    """Move ``amount`` from source to destination; raises BusinessFailure for 402/404/422."""
    ordered = sorted((request.source, request.destination))
    rows = await conn.fetch(_LOCK_ACCOUNTS, ordered, tenant)
    found = {row["id"]: row for row in rows}
    for role, account_id in (("source", request.source), ("destination", request.destination)):
        if account_id not in found:
            raise BusinessFailure("account-not-found", f"{role} account {account_id} not found")
    source, destination = found[request.source], found[request.destination]
    for role, row in (("source", source), ("destination", destination)):
        if row["currency"] != request.currency:
            raise BusinessFailure(
                "currency-mismatch",
                f"{role} account holds {row['currency']}, the transfer is in {request.currency}",
            )
    if source["balance"] < request.amount:
        raise BusinessFailure(
            "insufficient-funds",
            f"source balance {source['balance']} is below the amount {request.amount}",
        )
    if destination["balance"] + request.amount > MAX_AMOUNT:
        raise BusinessFailure("balance-limit", "the destination balance would exceed the limit")
    transfer_id = uuid.uuid4()
    created_at = datetime.now(UTC)
    await conn.execute(
        _MOVE,
        transfer_id,
        tenant,
        operation_id,
        request.source,
        request.destination,
        request.amount,
        binding_generation,
        request.currency,
        request.memo,
        created_at,
    )
    return Transfer(
        id=transfer_id,
        source=request.source,
        destination=request.destination,
        amount=request.amount,
        currency=request.currency,
        memo=request.memo,
        created_at=created_at,
    )
