"""Schema changes while servers run: a migration's DDL that needs a table's ACCESS EXCLUSIVE
lock takes it in a short transaction that waits for it briefly and gives way, then tries
again, so a long reader (a report, ``pg_dump``, an open psql transaction) never makes every
server's statement queue behind a waiting ALTER. Used by the migrations (0017 on)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

__all__ = ["LOCK_PAUSE", "LOCK_TRIES", "LOCK_WAIT", "briefly"]

# How long a DDL transaction waits for its tables' locks (writes queue behind a waiting
# ACCESS EXCLUSIVE request meanwhile): under deadlock_timeout (1 s by default), so this
# transaction, not a server's, is the one that gives way; then it waits LOCK_PAUSE seconds
# and tries again, up to LOCK_TRIES times
LOCK_WAIT = "500ms"
LOCK_PAUSE = 0.2
LOCK_TRIES = 100
RETRIED = ("55P03", "40P01")  # lock_not_available, deadlock_detected


def briefly(bind: Connection, tables: Sequence[str], statements: Sequence[str]) -> None:
    """``statements`` in one short transaction of their own that first locks ``tables`` in
    the order the server's statements lock them (operations before the tables that refer to
    it, accounts before transfers): waiting at most :data:`LOCK_WAIT` for them, so a
    server's writes never queue behind it for longer; when they are not granted (or
    PostgreSQL breaks a deadlock by ending this one), it is tried again after
    :data:`LOCK_PAUSE`, up to :data:`LOCK_TRIES` times. One DO block: one statement, one
    transaction, so ``bind`` must be in autocommit (alembic's ``autocommit_block``)."""
    body = "; ".join(
        [
            f"PERFORM set_config('lock_timeout', '{LOCK_WAIT}', true)",
            f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE",
            *statements,
        ]
    )
    block = sa.text(f"DO $do$BEGIN {body}; END$do$")
    for attempt in range(1, LOCK_TRIES + 1):
        try:
            bind.execute(block)
            return
        except sa.exc.DBAPIError as exc:
            code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            if code not in RETRIED or attempt == LOCK_TRIES:
                raise
            time.sleep(LOCK_PAUSE)
