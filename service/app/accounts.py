"""The demo ledger's account read: one account of the caller's tenant, or not-found."""

from __future__ import annotations

import uuid

from service.app.answers import Problem
from service.domain.ledger import Account
from service.domain.principals import Principal
from service.store.accounts import account_of
from service.store.pool import HotPool

__all__ = ["AccountQueries"]


class AccountQueries:
    def __init__(self, views: HotPool) -> None:
        self._views = views  # asyncpg connections of the engine's pool (HotPool)

    async def by_id(self, principal: Principal, account_id: uuid.UUID) -> Account | Problem:
        """The account if it is in the principal's tenant; another tenant's account is not
        found, as an unknown one is."""
        row = await account_of(self._views, principal.tenant, account_id)
        if row is None:
            return Problem("not-found", f"no account {account_id}")
        return Account(id=row.id, currency=row.currency, balance=row.balance)
