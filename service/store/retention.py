"""Retention (docs/design.md §9): terminal results are kept for a while, then only a tombstone is.

* :class:`Retention`: how long a route's terminal results are kept, and how long a tombstone
  remembers the key afterwards.
* :meth:`RetentionStore.purge`: one bounded batch of expired ``completed`` / ``failed``
  operations becomes tombstones (scope, fingerprint, operation id, final state, expiry). The
  operation row goes with its attempts and epochs (``ON DELETE CASCADE``) and its
  observations; effect rows (accounts, transfers) keep the operation id. Rows are taken
  ``FOR UPDATE SKIP LOCKED``: a row another transaction holds (a settlement, a supersede) is
  left for a later pass, and any number of processes can purge at once.
* :meth:`RetentionStore.forget`: one bounded batch of tombstones past their retention is
  deleted, with the observations written about their operation after its purge (a feed
  event or an observer's evidence arriving for an expired operation, each quarantined
  ``operation-expired``); the key is new again.
* :meth:`RetentionStore.forget_feed_rows`: one bounded batch of a feed's final receipts that
  no page can serve again, and of alarms not raised again, past ``Retention.feed_rows``.
  A receipt is kept while its event may still be served to its observer: a timestamp feed's
  main pages ask strictly after the closed timestamp and its audit reads back the audit
  window, so a receipt whose timestamp is more than the window behind the closed timestamp
  is out of every page's reach, unless an audit walk under way (``walk_after``: begun
  before the closed timestamp jumped) still reads after it on its way to the closed
  timestamp; a cursor feed whose source promises ``no-backfill`` asks
  only after its checkpoint and reads again from the checkpoint it was promoted to one audit
  window ago, so a receipt at or below a position the checkpoint was promoted to longer ago
  than ``feed_rows`` (``feed_promotions``: when it was passed, not when it was decided) is
  out of reach, and the promotions behind the newest such one go too; a cursor feed that
  may backfill is read again from its start, so its receipts are kept.
  Only an overlap page repeats an event behind that reach; one whose receipt is gone is
  decided again like any late event (alarmed; its operation's settled or expired outcome
  makes it a replay or a quarantine), never a second effect. Holds are never purged.
* :meth:`RetentionStore.forget_orphans`: one bounded batch of observations about an
  operation that was never here (``unknown-operation``: an observer's evidence, a feed event
  past its grace), past ``Retention.orphans``, oldest first through their own partial
  index. One whose operation id is here after all is left to go with that operation.

``in_progress``, ``unknown`` and ``conflict`` operations are never purged: the statement
selects only ``completed`` and ``failed`` rows.

A retry racing the purge of its own operation reads the scope in one statement (one
snapshot): it sees the row (and replays it) or the tombstone (410), never neither, because a
purge deletes the row and writes the tombstone in one transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["PurgePage", "Retention", "RetentionStore", "Tombstone"]


class Retention(msgspec.Struct, frozen=True):
    """Seconds a terminal result is kept (``default``, or its route's own), and seconds a
    tombstone is kept after that; seconds a feed's final receipt out of every page's reach
    (and an alarm not raised again) is kept, and per feed whose receipts may go, how far
    behind its checkpoint its pages still reach (timestamp feeds: the audit window in
    seconds; cursor feeds that promise no-backfill: 0); seconds an observation about an
    operation that was never here is kept."""

    default: float
    tombstone: float
    routes: Mapping[str, float] = msgspec.field(default_factory=dict)
    feed_rows: float = 2_592_000.0
    feed_reach: Mapping[str, int] = msgspec.field(default_factory=dict)
    orphans: float = 2_592_000.0

    def of(self, route: str) -> float:
        return self.routes.get(route, self.default)


class Tombstone(msgspec.Struct, frozen=True):
    """What is left of a purged operation."""

    tenant: str
    principal_id: uuid.UUID
    operation_id: uuid.UUID
    request_fingerprint: str
    final_state: str
    expired_at: datetime
    forget_at: datetime
    """it stands (410, nothing claimed under its key) until then: the schema's
    ``tombstone_stands`` (migration 0011) is the rule"""


class PurgePage(msgspec.Struct, frozen=True):
    purged: int
    full: bool
    """the batch was full: more may be waiting"""


# The purge and the forgetting find their rows across tenants in one read without a lock (an
# index's first entries: the oldest first), then take them tenant by tenant, each tenant's in
# a transaction of its own (one shard on Citus) whose every statement is pinned to it.
_PURGEABLE = text(
    """/* spans tenants: the purge finds the oldest expired terminal rows of every tenant (a read,
   no lock); it locks, deletes and tombstones them tenant by tenant */
SELECT tenant, id FROM operations
 WHERE state IN ('completed', 'failed') AND expires_at <= :now
 ORDER BY expires_at
 LIMIT :batch"""
)

_PURGE = text(
    """
WITH doomed AS (
    SELECT id FROM operations
     WHERE tenant = :tenant AND id = ANY(CAST(:ids AS uuid[]))
       AND state IN ('completed', 'failed') AND expires_at <= :now
     FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM operations o USING doomed
     WHERE o.tenant = :tenant AND o.id = doomed.id
    RETURNING o.id, o.tenant, o.principal_id, o.route, o.idempotency_key,
              o.request_fingerprint, o.state, o.expires_at
), unobserved AS (
    DELETE FROM observations
     WHERE tenant = :tenant AND operation_id IN (SELECT id FROM gone)
), kept AS (
    INSERT INTO tombstones (tenant, principal_id, route, idempotency_key, operation_id,
        request_fingerprint, final_state, expired_at, forget_at)
    SELECT tenant, principal_id, route, idempotency_key, id, request_fingerprint, state,
           expires_at, :forget_at
      FROM gone
    ON CONFLICT (tenant, principal_id, route, idempotency_key) DO UPDATE
       SET operation_id = EXCLUDED.operation_id,
           request_fingerprint = EXCLUDED.request_fingerprint,
           final_state = EXCLUDED.final_state,
           expired_at = EXCLUDED.expired_at,
           forget_at = EXCLUDED.forget_at
)
SELECT count(*) FROM gone
"""
)

_FORGETTABLE = text(
    """/* spans tenants: forgetting finds the oldest tombstones past their retention in every
   tenant (a read, no lock); it deletes them tenant by tenant */
SELECT tenant, principal_id, route, idempotency_key FROM tombstones
 WHERE forget_at <= :now
 ORDER BY forget_at
 LIMIT :batch"""
)

_FORGET = text(
    """
WITH doomed AS (
    SELECT principal_id, route, idempotency_key FROM tombstones
     WHERE tenant = :tenant AND forget_at <= :now
       AND (principal_id, route, idempotency_key) IN (
           SELECT * FROM unnest(CAST(:principals AS uuid[]), CAST(:routes AS text[]),
                                CAST(:keys AS text[])))
     FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM tombstones t USING doomed d
     WHERE t.tenant = :tenant
       AND (t.principal_id, t.route, t.idempotency_key)
         = (d.principal_id, d.route, d.idempotency_key)
    RETURNING t.operation_id
)
SELECT operation_id FROM gone
"""
)
# What was reported about an operation after its purge (a feed's event, an observer's
# evidence: quarantined operation-expired) goes with its tombstone; it may be kept under the
# reporter's tenant, not the operation's, so this one looks in every tenant.
_UNOBSERVED = text(
    """/* spans tenants: the observations about a forgotten operation, written after its purge
   under whichever tenant reported them, go with its tombstone (by their operation_id index) */
DELETE FROM observations
 WHERE operation_id = ANY(CAST(:ids AS uuid[]))
   AND operation_id NOT IN (SELECT id FROM operations
                             WHERE tenant = :tenant AND id = ANY(CAST(:ids AS uuid[])))"""
)

# Per cursor feed, the greatest position its checkpoint was promoted to at or before
# :cutoff (NULL: no promotion that long ago): what the checkpoint has been past for the
# retention. Every pass reads after a checkpoint promoted to less than the retention ago.
_PASSED = """passed AS (
    SELECT c.name,
           (SELECT max(p.applied_position) FROM feed_promotions p
             WHERE p.feed = c.name AND p.promoted_at <= :cutoff) AS position
      FROM feed_checkpoints c
     WHERE c.kind = 'cursor'
)"""

_FORGET_RECEIPTS = text(
    """
WITH reach AS (
    SELECT * FROM unnest(CAST(:names AS text[]), CAST(:reach AS bigint[])) AS f(name, reach)
), """
    + _PASSED
    + """, floors AS (
    SELECT c.name,
           CASE c.kind
               WHEN 'timestamp' THEN
                   -- the next walk reads after one window behind the closed timestamp; a
                   -- walk under way reads after walk_after (-1: from the start) up to the
                   -- then closed timestamp. walk_after NULL (no walk under way) or no
                   -- closed timestamp leaves the comparison NULL: the ELSE arm
                   CASE WHEN c.walk_after + 1 < c.closed_through_timestamp - reach.reach
                        THEN c.walk_after + 1
                        ELSE c.closed_through_timestamp - reach.reach END
               ELSE passed.position + 1 END AS floor
      FROM feed_checkpoints c JOIN reach ON reach.name = c.name
      LEFT JOIN passed ON passed.name = c.name
), doomed AS (
    SELECT r.feed, r.event_id
      FROM feed_receipts r JOIN floors ON floors.name = r.feed
     WHERE r.decided_at <= :cutoff AND r.event_order < floors.floor AND r.state <> 'held'
     ORDER BY r.decided_at
     LIMIT :batch
     FOR UPDATE OF r SKIP LOCKED
), gone AS (
    DELETE FROM feed_receipts r USING doomed d
     WHERE (r.feed, r.event_id) = (d.feed, d.event_id)
    RETURNING 1
)
SELECT count(*) FROM gone
"""
)

# A promotion behind the newest one past the retention no longer sets any floor.
_FORGET_PROMOTIONS = text(
    """
WITH """
    + _PASSED
    + """, doomed AS (
    SELECT p.feed, p.applied_position
      FROM feed_promotions p JOIN passed ON passed.name = p.feed
     WHERE p.applied_position < passed.position
     LIMIT :batch
     FOR UPDATE OF p SKIP LOCKED
), gone AS (
    DELETE FROM feed_promotions p USING doomed d
     WHERE (p.feed, p.applied_position) = (d.feed, d.applied_position)
    RETURNING 1
)
SELECT count(*) FROM gone
"""
)

_FORGET_ALARMS = text(
    """
WITH doomed AS (
    SELECT feed, kind, event_id FROM feed_alarms
     WHERE last_at <= :cutoff
     LIMIT :batch
     FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM feed_alarms a USING doomed d
     WHERE (a.feed, a.kind, a.event_id) = (d.feed, d.kind, d.event_id)
    RETURNING 1
)
SELECT count(*) FROM gone
"""
)

# the orphans past their retention, oldest first through their own partial index
# (ix_observations_unknown_operation_created_at); one whose operation id is here after all
# (in its tenant) is left to go with that operation
_FORGET_ORPHANS = text(
    """/* spans tenants: forgetting finds the oldest observations about no operation in every
   tenant (a read, no lock); it deletes them tenant by tenant */
SELECT o.tenant, o.id FROM observations o
 WHERE o.reason = 'unknown-operation' AND o.created_at <= :cutoff
   AND NOT EXISTS (SELECT 1 FROM operations WHERE tenant = o.tenant AND id = o.operation_id)
 ORDER BY o.created_at
 LIMIT :batch"""
)
_FORGET_TENANTS_ORPHANS = text(
    """
WITH doomed AS (
    SELECT o.id FROM observations o
     WHERE o.tenant = :tenant AND o.id = ANY(CAST(:ids AS bigint[]))
       AND o.reason = 'unknown-operation' AND o.created_at <= :cutoff
       AND NOT EXISTS (SELECT 1 FROM operations
                        WHERE tenant = :tenant AND id = o.operation_id)
     FOR UPDATE OF o SKIP LOCKED
), gone AS (
    DELETE FROM observations o USING doomed d WHERE o.tenant = :tenant AND o.id = d.id
    RETURNING 1
)
SELECT count(*) FROM gone
"""
)

_OLDEST_OPEN = text(
    "/* spans tenants: the oldest open operation of every tenant, a gauge (a read, no lock) */"
    " SELECT min(created_at) FROM operations WHERE state IN ('in_progress', 'unknown', 'conflict')"
)

_TOMBSTONE = """SELECT tenant, principal_id, operation_id, request_fingerprint, final_state,
       expired_at, forget_at
  FROM tombstones"""
_BY_ID = text(
    _TOMBSTONE + " WHERE tenant = :tenant AND operation_id = :id ORDER BY forget_at DESC LIMIT 1"
)
# an operation id alone (an all-tenant admin's, a provider feed's event): its tenant unknown
_BY_ID_ANY_TENANT = text(
    "/* spans tenants: a tombstone named by an operation id alone, whose tenant the caller"
    " does not know (a read by the operation id's index) */ "
    + _TOMBSTONE
    + " WHERE operation_id = :id ORDER BY forget_at DESC LIMIT 1"
)
_BY_KEY = text(
    _TOMBSTONE + " WHERE tenant = :tenant AND principal_id = :principal_id"
    " AND idempotency_key = :key AND (CAST(:route AS text) IS NULL OR route = :route)"
    " ORDER BY expired_at DESC LIMIT 1"
)


class RetentionStore:
    def __init__(self, engine: AsyncEngine, retention: Retention) -> None:
        self._engine = engine
        self._reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.retention = retention

    async def purge(self, batch: int, now: datetime) -> PurgePage:
        """Tombstone up to ``batch`` expired terminal operations, the oldest first, tenant by
        tenant (one transaction each)."""
        forget_at = now + timedelta(seconds=self.retention.tombstone)
        found = await self._found(_PURGEABLE, {"now": now, "batch": batch})
        purged = 0
        for tenant, rows in _by_tenant(found).items():
            params = {"tenant": tenant, "ids": [row.id for row in rows], "now": now}
            async with self._engine.begin() as conn:
                gone = await conn.execute(_PURGE, params | {"forget_at": forget_at})
                purged += int(gone.scalar_one())
        return _page(purged, len(found), batch)

    async def forget(self, batch: int, now: datetime) -> PurgePage:
        """Delete up to ``batch`` tombstones past their retention, the oldest first, tenant by
        tenant (one transaction each)."""
        found = await self._found(_FORGETTABLE, {"now": now, "batch": batch})
        forgotten = 0
        for tenant, rows in _by_tenant(found).items():
            params = {
                "tenant": tenant,
                "now": now,
                "principals": [row.principal_id for row in rows],
                "routes": [row.route for row in rows],
                "keys": [row.idempotency_key for row in rows],
            }
            async with self._engine.begin() as conn:
                gone = list((await conn.execute(_FORGET, params)).scalars())
                if gone:
                    await conn.execute(_UNOBSERVED, {"tenant": tenant, "ids": gone})
            forgotten += len(gone)
        return _page(forgotten, len(found), batch)

    async def _found(self, stmt: Any, params: dict[str, Any]) -> list[Any]:
        """What a read across tenants (no lock) found."""
        async with self._reader.connect() as conn:
            return list((await conn.execute(stmt, params)).all())

    async def forget_feed_rows(self, batch: int, now: datetime) -> PurgePage:
        """Delete up to ``batch`` final feed receipts out of every page's reach, up to
        ``batch`` alarms, each past ``feed_rows``, and up to ``batch`` cursor feed promotions
        behind the newest one past ``feed_rows``, in one transaction."""
        cutoff = now - timedelta(seconds=self.retention.feed_rows)
        names = sorted(self.retention.feed_reach)
        reach = [self.retention.feed_reach[name] for name in names]
        async with self._engine.begin() as conn:
            receipts = (
                await conn.execute(
                    _FORGET_RECEIPTS,
                    {"names": names, "reach": reach, "cutoff": cutoff, "batch": batch},
                )
            ).scalar_one()
            alarms = (
                await conn.execute(_FORGET_ALARMS, {"cutoff": cutoff, "batch": batch})
            ).scalar_one()
            promotions = (
                await conn.execute(_FORGET_PROMOTIONS, {"cutoff": cutoff, "batch": batch})
            ).scalar_one()
        return PurgePage(
            purged=int(receipts) + int(alarms) + int(promotions),
            full=max(receipts, alarms, promotions) >= batch,
        )

    async def forget_orphans(self, batch: int, now: datetime) -> PurgePage:
        """Delete up to ``batch`` observations about an operation that was never here, past
        ``orphans``, the oldest first, tenant by tenant (one transaction each)."""
        cutoff = now - timedelta(seconds=self.retention.orphans)
        found = await self._found(_FORGET_ORPHANS, {"cutoff": cutoff, "batch": batch})
        gone = 0
        for tenant, rows in _by_tenant(found).items():
            params = {"tenant": tenant, "ids": [row.id for row in rows], "cutoff": cutoff}
            async with self._engine.begin() as conn:
                gone += int((await conn.execute(_FORGET_TENANTS_ORPHANS, params)).scalar_one())
        return _page(gone, len(found), batch)

    async def oldest_open(self) -> datetime | None:
        """When the oldest operation that is not settled for good (in_progress, unknown,
        conflict) was created; None when there is none."""
        async with self._reader.connect() as conn:
            found: datetime | None = (await conn.execute(_OLDEST_OPEN)).scalar_one()
        return found

    async def by_operation(
        self, operation_id: uuid.UUID, tenant: str | None = None
    ) -> Tombstone | None:
        """The tombstone of ``operation_id`` (of ``tenant``; None: of whichever tenant)."""
        stmt, params = _BY_ID, {"id": operation_id, "tenant": tenant}
        if tenant is None:
            stmt, params = _BY_ID_ANY_TENANT, {"id": operation_id}
        async with self._reader.connect() as conn:
            row = (await conn.execute(stmt, params)).mappings().first()
        return None if row is None else Tombstone(**row)

    async def by_key(
        self, tenant: str, principal_id: uuid.UUID, key: str, route: str | None
    ) -> Tombstone | None:
        """The caller's most recent tombstone under ``key`` (optionally on one route)."""
        params = {"tenant": tenant, "principal_id": principal_id, "key": key, "route": route}
        async with self._reader.connect() as conn:
            row = (await conn.execute(_BY_KEY, params)).mappings().first()
        return None if row is None else Tombstone(**row)


def _by_tenant(found: list[Any]) -> dict[str, list[Any]]:
    """The rows found, per tenant (in the order the tenants first appear)."""
    grouped: dict[str, list[Any]] = {}
    for row in found:
        grouped.setdefault(row.tenant, []).append(row)
    return grouped


def _page(done: int, found: int, batch: int) -> PurgePage:
    """Full (more may wait) when the read found a whole batch and some of it went: rows
    another transaction holds are left for a later pass, not read again at once."""
    return PurgePage(purged=done, full=found >= batch and done > 0)
