"""Keyset cursors for the admin lists: an opaque token of the last row's (moment, key), and
the predicate "strictly after it" in the list's order (moment, then key)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, or_

from service.errors import SettlementError

__all__ = ["BadCursor", "after", "decode", "encode"]

# A cursor's moment is a row's timestamp: anything outside these is not one of ours.
CURSOR_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
CURSOR_LATEST = datetime(9000, 1, 1, tzinfo=UTC)
# Longest token accepted: a timestamp and a 255-character key, base64, with room to spare.
MAX_CURSOR = 512


class BadCursor(SettlementError, ValueError):
    """A list cursor that does not decode (not one this server handed out)."""

    problem = "validation-error"


def encode(moment: datetime, key: str) -> str:
    return base64.urlsafe_b64encode(f"{moment.isoformat()}|{key}".encode()).decode()


def decode(cursor: str) -> tuple[datetime, str]:
    """A cursor :func:`encode` made: an aware timestamp PostgreSQL can hold, and the key."""
    try:
        if len(cursor) > MAX_CURSOR:
            raise ValueError("too long")
        moment_text, key = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        if "\x00" in key:  # PostgreSQL text holds no NUL: refused here, never a 500 there
            raise ValueError("a NUL in the key")
        moment = datetime.fromisoformat(moment_text)
        if moment.tzinfo is None or not CURSOR_EARLIEST <= moment <= CURSOR_LATEST:
            raise ValueError("timestamp out of range")
        # PostgreSQL compares in UTC; an odd offset (+23:59) must not reach the driver
        return moment.astimezone(UTC), key
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise BadCursor("malformed cursor") from exc


def after(moment_column: Any, key_column: Any, moment: datetime, key: Any) -> ColumnElement[bool]:
    """Rows strictly after (``moment``, ``key``) in (moment, key) order."""
    return or_(moment_column > moment, and_(moment_column == moment, key_column > key))
