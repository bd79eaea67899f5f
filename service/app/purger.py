"""The retention purge (docs/design.md §9): expired terminal operations become tombstones,
tombstones past their own retention are forgotten, and so are a feed's final receipts out of
every page's reach, its alarms not raised again, and observations about an operation that was
never here.

A background loop in every server process (``run``), and part of ``settlement sweep``
(``run_once`` until nothing is left). Each batch finds at most ``batch`` rows across tenants
(a read, no lock), then takes them tenant by tenant, each tenant's in one short transaction
pinned to it, ``FOR UPDATE SKIP LOCKED`` (a feed's rows, local to the coordinator, in one),
so several processes purge side by side and a replay of another key never waits behind a
whole purge.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

from service.config import FeedSpec, Settings
from service.store.retention import PurgePage, Retention, RetentionStore
from service.store.rows import at
from service.telemetry import Metrics

__all__ = ["PURGE_BATCH", "Purged", "Purger", "feed_reach", "retention_of"]

log = logging.getLogger("settlement.purger")

# Rows per transaction: a batch of this size holds its locks for milliseconds.
PURGE_BATCH = 500
# Batches per pass of the background loop, so one pass over a large backlog still yields to
# the sweeper's interval; the next pass goes on where this one stopped.
MAX_BATCHES_PER_PASS = 200


def feed_reach(specs: Sequence[FeedSpec], audit_window: float) -> dict[str, int]:
    """The feeds whose final receipts may be purged, each with how far behind its checkpoint
    its pages still reach: a timestamp feed's audit window; 0 for a cursor feed whose source
    promises no-backfill (behind the checkpoint it was promoted to longer ago than the
    retention: its passes read after one promoted to one audit window ago). A cursor feed
    that may backfill is read again from its start, so none of its receipts is ever out of
    reach (it is not listed)."""
    reach: dict[str, int] = {}
    for spec in specs:
        if spec.kind == "timestamp":
            reach[spec.name] = int(audit_window)
        elif "no-backfill" in spec.promises:
            reach[spec.name] = 0
    return reach


def retention_of(settings: Settings, routes: Mapping[str, float] | None = None) -> Retention:
    """What the settings keep, and for how long; ``routes``: the routes that keep their
    terminal results for a time of their own (what their settlement writes as the row's
    expiry; the purge reads only that)."""
    return Retention(
        default=settings.retention,
        tombstone=settings.tombstone_retention,
        routes=dict(routes or {}),
        feed_rows=settings.feed_retention,
        feed_reach=feed_reach(settings.feed_specs(), settings.feed_audit_window),
        orphans=settings.orphan_retention,
    )


class Purged:
    """What one pass did (or several, :meth:`add`-ed up)."""

    def __init__(self) -> None:
        self.operations = 0
        self.tombstones = 0
        self.feed_rows = 0
        self.orphans = 0
        self.more = False

    def add(self, later: Purged) -> None:
        """Count a later pass in; ``more`` is the later pass's."""
        self.operations += later.operations
        self.tombstones += later.tombstones
        self.feed_rows += later.feed_rows
        self.orphans += later.orphans
        self.more = later.more


class Purger:
    def __init__(
        self,
        store: RetentionStore,
        metrics: Metrics,
        *,
        interval: float,
        clock: Callable[[], float],
        batch: int = PURGE_BATCH,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._interval = interval
        self._clock = clock
        self._batch = batch

    async def run_once(self, max_batches: int = MAX_BATCHES_PER_PASS) -> Purged:
        """Purge expired operations, then forget old tombstones, old feed rows and old
        observations about no operation, batch by batch (at most ``max_batches`` of each),
        and refresh the oldest-open-operation gauge."""
        done = Purged()
        done.operations = await self._drain(self._store.purge, max_batches, done)
        done.tombstones = await self._drain(self._store.forget, max_batches, done)
        done.feed_rows = await self._drain(self._store.forget_feed_rows, max_batches, done)
        done.orphans = await self._drain(self._store.forget_orphans, max_batches, done)
        if done.operations:
            self._metrics.inc("settlement_purged_operations_total", done.operations)
        if done.tombstones:
            self._metrics.inc("settlement_forgotten_tombstones_total", done.tombstones)
        if done.feed_rows:
            self._metrics.inc("settlement_forgotten_feed_rows_total", done.feed_rows)
        if done.orphans:
            self._metrics.inc("settlement_forgotten_orphan_observations_total", done.orphans)
        oldest = await self._store.oldest_open()
        age = 0.0 if oldest is None else max(0.0, self._clock() - oldest.timestamp())
        self._metrics.set("settlement_oldest_open_operation_age_seconds", age)
        if done.operations or done.tombstones or done.feed_rows or done.orphans:
            log.info(
                "retention purge",
                extra={
                    "purged_operations": done.operations,
                    "forgot_tombstones": done.tombstones,
                    "forgot_feed_rows": done.feed_rows,
                    "forgot_orphan_observations": done.orphans,
                },
            )
        return done

    async def _drain(
        self,
        step: Callable[[int, datetime], Awaitable[PurgePage]],
        max_batches: int,
        done: Purged,
    ) -> int:
        """``step`` batch after batch until one is not full (at most ``max_batches``; when
        that is not enough, ``done.more``); how many rows it purged in all."""
        purged = 0
        for _ in range(max_batches):
            page = await step(self._batch, at(self._clock()))
            purged += page.purged
            if not page.full:
                return purged
        done.more = True
        return purged

    async def run(self) -> None:
        """Purge every ``interval`` seconds until cancelled; errors are logged, not fatal."""
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("purge failed; will retry", extra={"error": repr(exc)})
            await asyncio.sleep(self._interval)
