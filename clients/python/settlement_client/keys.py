"""One key per intended action, kept across the caller's own restarts.

Persist an :class:`IntendedAction` (``dumps()``) before its first send; after a crash,
load it (``IntendedAction.loads``) and ``client.perform(action)`` again: the same key
replays what the first run did, or finishes it, and never runs it twice.
"""

from __future__ import annotations

from typing import Any, Self

import msgspec

from ._actions import IntendedActions, Kind
from ._routes import new_key

__all__ = ["IntendedAction"]


class IntendedAction(IntendedActions, msgspec.Struct, frozen=True, kw_only=True):
    """What to do (``kind`` and ``body``) and the Idempotency-Key that names it. Made by
    ``IntendedAction.<kind>(...)``, one constructor per idempotent route (``transfer``,
    ``account``, ``payout``, ``refund``, ...), with the arguments of ``create_<kind>``."""

    kind: Kind
    key: str
    body: dict[str, Any]

    @classmethod
    def of(cls, kind: Kind, body: Any, key: str | None) -> Self:
        """An action of ``kind`` with ``body`` (a request model) and ``key`` (None: a new one)."""
        return cls(kind=kind, key=key or new_key(), body=msgspec.to_builtins(body))

    def dumps(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def loads(cls, data: bytes | str) -> IntendedAction:
        return msgspec.json.decode(data, type=cls)
