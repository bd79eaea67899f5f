"""Read model of the demo ledger's accounts: one account of one tenant. Reads only.

One statement on an asyncpg connection (:mod:`service.store.pool`), no lock and no
transaction; the ledger's writes are the local effect's (:mod:`service.domain.ledger`).
"""

from __future__ import annotations

import uuid

import msgspec

from service.store.pool import HotPool

__all__ = ["AccountRow", "account_of"]

# another tenant's account is not found, as an unknown one is (never reveal existence)
_BY_ID = "SELECT id, currency, balance FROM accounts WHERE id = $1 AND tenant = $2"


class AccountRow(msgspec.Struct, frozen=True):
    id: uuid.UUID
    currency: str
    balance: int


async def account_of(pool: HotPool, tenant: str, account_id: uuid.UUID) -> AccountRow | None:
    """The account ``account_id`` if it belongs to ``tenant``, else None."""
    async with pool.acquire() as conn:
        row = await conn.fetchrow(_BY_ID, account_id, tenant)
    if row is None:
        return None
    return AccountRow(id=row["id"], currency=row["currency"], balance=row["balance"])
