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
from typing import Annotated

import msgspec

from service.domain.currencies import ISO_4217

__all__ = [
    "Account",
    "AccountRequest",
    "Transfer",
    "TransferRequest",
    "create_account_statement",
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


def _known_currency(code: str) -> None:
    if code not in ISO_4217:
        raise ValueError(f"unknown currency {code!r} (ISO 4217)")


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
), verdict AS (
    SELECT CASE
             WHEN s.id IS NULL THEN ARRAY['account-not-found',
                 'source account ' || $E3::uuid || ' not found']
             WHEN d.id IS NULL THEN ARRAY['account-not-found',
                 'destination account ' || $E4::uuid || ' not found']
             WHEN s.currency <> $E6::varchar THEN ARRAY['currency-mismatch',
                 'source account holds ' || s.currency || ', the transfer is in ' || $E6::varchar]
             WHEN d.currency <> $E6::varchar THEN ARRAY['currency-mismatch',
                 'destination account holds ' || d.currency || ', the transfer is in '
                 || $E6::varchar]
             WHEN s.balance < $E5::bigint THEN ARRAY['insufficient-funds',
                 'source balance ' || s.balance || ' is below the amount ' || $E5::bigint]
             WHEN d.balance + $E5::bigint > $E7::bigint THEN ARRAY['balance-limit',
                 'the destination balance would exceed the limit']
           END AS refusal,
           s.balance - $E5::bigint AS source_after, d.balance + $E5::bigint AS destination_after
      FROM (SELECT 1) AS one
      LEFT JOIN locked s ON s.id = $E3::uuid
      LEFT JOIN locked d ON d.id = $E4::uuid
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
    """Move ``amount`` from source to destination: (guard, writes, their ``$E<n>`` values,
    the transfer made when the guard lets it through). The guard refuses with
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
_ACCOUNT_GUARD = "verdict AS (SELECT NULL::text[] AS refusal)"
_ACCOUNT_APPLY = """
opened AS (
    INSERT INTO accounts (id, tenant, currency, balance, operation_id, binding_generation)
    SELECT $E1::uuid, $E2::varchar, $E3::varchar, $E4::bigint, $E5::uuid, $E6::int
     WHERE EXISTS (SELECT 1 FROM written)
)"""


def create_account_statement(
    tenant: str, operation_id: uuid.UUID, binding_generation: int, request: AccountRequest
) -> tuple[str, str, tuple[object, ...], Account]:
    """Open an account: (guard, writes, their ``$E<n>`` values, the account)."""
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
