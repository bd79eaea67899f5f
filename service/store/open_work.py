"""What ``/metrics`` says of the operations table: open operations by state, and how far the
retention purge is behind. Read by the background reader of the figures
(:mod:`service.app.feed_figures`) on its own connection, never by a request or a scrape.

**Cost**, every ``SETTLEMENT_FEED_FIGURES_INTERVAL`` in one worker (``EXPLAIN (ANALYZE,
BUFFERS)`` on PostgreSQL 18 with 205,000 terminal operations, 150,000 unknown, 1,000 in
progress and 50 in conflict, one tenant):

* each state's count reads only the partial indexes of the open rows (terminal rows, the bulk,
  are in none of them) and stops at :data:`OPEN_COUNT_CAP` rows (``Limit``): the planner
  takes the state's own entries of ``ix_operations_open_tenant_state`` (``Index Only Scan``,
  ``Index Cond: state = ...``, a skip scan: one index search per tenant) for a rare state, and
  ``ix_operations_open_created_at`` up to the cap for a common one; 3.3 ms for the three
  counts (10,000 + 1,000 + 50 rows) with the pages cached, 30-50 ms on a cold cache; a cap of
  100,000 took 60 ms, so the cap bounds the cost of a large backlog;
* the oldest expiry is the first entry of the purge's own index
  (``ix_operations_purgeable_expires_at``, ``Index Only Scan`` under ``Limit 1``): 0.05 ms.

A read slower than ``SETTLEMENT_DB_STATEMENT_TIMEOUT`` (many tenants, a cold cache) is
cancelled by PostgreSQL like any statement; the last figures stay, their age grows.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["OPEN_COUNT_CAP", "OPEN_STATES", "OpenWork", "read_open_work"]

# At most this many operations of one state are counted: past it the exact figure changes
# nothing an operator does, and the count stays a few milliseconds however large the backlog.
OPEN_COUNT_CAP = 10_000

# The states of an operation not settled for good (the work list's).
OPEN_STATES = ("in_progress", "unknown", "conflict")

# Each state written inline: the partial indexes' predicates name them, and a generic plan
# (plan_cache_mode, service.store.db.server_settings) cannot prove one from a parameter.
_OPEN_WORK = text(
    """/* spans tenants: the open-work figures count every tenant's open operations (a read,
   no lock, capped per state) */
SELECT (SELECT count(*) FROM (SELECT 1 FROM operations WHERE state = 'in_progress'
                               LIMIT :cap) AS o) AS in_progress,
       (SELECT count(*) FROM (SELECT 1 FROM operations WHERE state = 'unknown'
                               LIMIT :cap) AS o) AS unknown,
       (SELECT count(*) FROM (SELECT 1 FROM operations WHERE state = 'conflict'
                               LIMIT :cap) AS o) AS conflict
"""
)
_FIRST_EXPIRY = text(
    "/* spans tenants: how far the purge is behind, over every tenant (a read, no lock) */"
    " SELECT min(expires_at) FROM operations WHERE state IN ('completed', 'failed')"
)


class OpenWork(msgspec.Struct, frozen=True):
    """Open operations by state (each at most :data:`OPEN_COUNT_CAP`), and when the first
    terminal operation still stored expires or expired (None: none will)."""

    counts: dict[str, int]
    first_expiry: datetime | None


async def read_open_work(engine: AsyncEngine, cap: int = OPEN_COUNT_CAP) -> OpenWork:
    """The figures, in one statement on a connection of ``engine``."""
    async with engine.connect() as conn:
        counts = (await conn.execute(_OPEN_WORK, {"cap": cap})).one()
        first_expiry = (await conn.execute(_FIRST_EXPIRY)).scalar_one()
    return OpenWork(
        counts={state: int(getattr(counts, state)) for state in OPEN_STATES},
        first_expiry=first_expiry,
    )
