"""One key per intended action, kept across the caller's own restarts.

Persist an :class:`IntendedAction` (``dumps()``) before its first send; after a crash,
load it (``IntendedAction.loads``) and ``client.perform(action)`` again: the same key
replays what the first run did, or finishes it, and never runs it twice.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from . import _routes

__all__ = ["IntendedAction"]


class IntendedAction(msgspec.Struct, frozen=True, kw_only=True):
    """What to do (``kind`` and ``body``) and the Idempotency-Key that names it."""

    kind: Literal["account", "transfer", "payout"]
    key: str
    body: dict[str, Any]

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
    ) -> IntendedAction:
        body = _routes.transfer(source, destination, amount, currency, memo)
        return cls(kind="transfer", key=key or _routes.new_key(), body=msgspec.to_builtins(body))

    @classmethod
    def account(
        cls, currency: str, opening_balance: int = 0, *, key: str | None = None
    ) -> IntendedAction:
        body = _routes.account(currency, opening_balance)
        return cls(kind="account", key=key or _routes.new_key(), body=msgspec.to_builtins(body))

    @classmethod
    def payout(
        cls, beneficiary: str, amount: int, currency: str, *, key: str | None = None
    ) -> IntendedAction:
        body = _routes.payout(beneficiary, amount, currency)
        return cls(kind="payout", key=key or _routes.new_key(), body=msgspec.to_builtins(body))

    def dumps(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def loads(cls, data: bytes | str) -> IntendedAction:
        return msgspec.json.decode(data, type=cls)
