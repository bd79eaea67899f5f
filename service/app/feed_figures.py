"""The figures of ``/metrics`` read from the database by a background task, never by a
scrape: the feeds' (receipts by state, alarms by kind, lags, the oldest unknown payout's age)
and the operations' (open ones by state, how far the retention purge is behind), and each
feed's stall (:mod:`service.app.feed_stalls`).

Counting the receipts is a whole-table aggregate (about 250 ms at two million receipts): run
by every scrape on the request pool, anyone scraping in a loop slowed every tenant's
requests. :class:`FeedFigureKeeper` reads them every ``SETTLEMENT_FEED_FIGURES_INTERVAL``
on a connection of its own, in one worker of the server at a time
(:class:`service.telemetry.feed_figures.FigureShelf`), and a scrape renders the last figures
read, with their age (``settlement_feed_figures_age_seconds``). The operations' figures are
cheap (capped index counts, :mod:`service.store.open_work`) and read in the same turn.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Collection, Sequence

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_stalls import read_stalls
from service.store.feeds import FeedStore
from service.store.open_work import OPEN_COUNT_CAP, read_open_work
from service.telemetry.feed_figures import FigureShelf, feed_exposition, work_exposition

__all__ = ["FeedFigureKeeper", "FeedFigures", "read_figures"]

log = logging.getLogger("settlement.feeds")


class FeedFigures(msgspec.Struct, frozen=True):
    """What ``/metrics`` says of the feeds: events by (feed, receipt state), alarms by (feed,
    kind), each feed's lag in seconds, the oldest unknown external operation's age, and when
    they were read (``read_at``, seconds since the epoch); and the open operations by state
    (each counted up to ``OPEN_COUNT_CAP``) and the purge's backlog, in seconds since the
    oldest terminal operation still stored expired (None: not read)."""

    events: list[tuple[str, str, int]]
    alarms: list[tuple[str, str, int]]
    lags: list[tuple[str, float]]
    oldest_unknown: float
    read_at: float
    open_operations: list[tuple[str, int]] = msgspec.field(default_factory=list)
    purge_backlog: float | None = None
    stalls: list[tuple[str, float]] = msgspec.field(default_factory=list)
    """each feed's stall in seconds, 0 when it is not flagged (:mod:`service.app.feed_stalls`)"""


async def read_figures(
    store: FeedStore,
    external_routes: Sequence[str],
    clock: Callable[[], float],
    operations: AsyncEngine | None = None,
    stall_after: float | None = None,
) -> FeedFigures:
    """The figures, read from the database: the same from every process, whichever observer
    did the work; the operations' too with ``operations`` (the reader's engine).
    ``stall_after``: ``SETTLEMENT_FEED_STALL_AFTER`` (None: no feed is flagged stalled)."""
    now = clock()
    open_operations: list[tuple[str, int]] = []
    purge_backlog = None
    if operations is not None:
        work = await read_open_work(operations)
        open_operations = sorted(work.counts.items())
        expiry = work.first_expiry
        purge_backlog = 0.0 if expiry is None else max(0.0, now - expiry.timestamp())
    checkpoints = await store.checkpoints.all()
    lags = {
        checkpoint.name: max(0.0, now - checkpoint.caught_up_at.timestamp())
        for checkpoint in checkpoints
        if checkpoint.caught_up_at is not None
    }
    oldest_unknown = await store.checkpoints.oldest_unknown(external_routes)
    stalls = await read_stalls(
        store,
        external_routes,
        clock,
        stall_after,
        checkpoints=checkpoints,
        oldest_unknown=oldest_unknown,
    )
    return FeedFigures(
        events=sorted((f, s, n) for (f, s), n in (await store.receipts.counts()).items()),
        alarms=sorted((f, k, n) for (f, k), n in (await store.alarms.counts()).items()),
        lags=sorted(lags.items()),
        oldest_unknown=oldest_unknown or 0.0,
        read_at=now,
        open_operations=open_operations,
        purge_backlog=purge_backlog,
        stalls=[(s.feed, s.seconds if s.flagged else 0.0) for s in stalls],
    )


class FeedFigureKeeper:
    """Reads the feeds' figures in the background and renders the last ones for a scrape."""

    def __init__(
        self,
        shelf: FigureShelf,
        *,
        external_routes: Collection[str],
        interval: float,
        clock: Callable[[], float],
        stall_after: float | None = None,
    ) -> None:
        """``shelf``: where the figures are kept for every worker; ``interval``: seconds
        between two reads (``SETTLEMENT_FEED_FIGURES_INTERVAL``); ``stall_after``:
        ``SETTLEMENT_FEED_STALL_AFTER`` (None: no feed is flagged stalled)."""
        self._stall_after = stall_after
        self._shelf = shelf
        self._external = sorted(external_routes)
        self._interval = interval
        self._clock = clock

    async def run_once(self, store: FeedStore, operations: AsyncEngine | None = None) -> bool:
        """Read the figures from ``store`` (its own connection) and, with ``operations`` (the
        same connection's engine), the operations' too, and keep them, if this process is
        the one that does; whether it read them."""
        if not self._shelf.lead():
            return False
        try:
            figures = await read_figures(
                store, self._external, self._clock, operations, self._stall_after
            )
        except BaseException:
            self._shelf.close()  # another worker, whose connection may work, takes a turn
            raise
        self._shelf.put(msgspec.json.encode(figures))
        return True

    async def run(self, store: FeedStore, operations: AsyncEngine | None = None) -> None:
        """Every interval until cancelled, the first at once; a failed read is logged, and
        the figures kept stay (their age grows)."""
        failed = False
        while True:
            try:
                await self.run_once(store, operations)
                failed = False
            except Exception as exc:  # the database is away: keep the last figures, retry
                if not failed:
                    log.warning(
                        "feed figures for /metrics could not be read; the last ones stay",
                        extra={"error": repr(exc), "retry_in_s": self._interval},
                    )
                failed = True
            await asyncio.sleep(self._interval)

    def exposition(self) -> str:
        """The last figures kept, as Prometheus text, with their age: no database query."""
        kept = self._shelf.get()
        figures = None
        if kept is not None:
            try:
                figures = msgspec.json.decode(kept, type=FeedFigures)
            except msgspec.DecodeError:  # a file of another version: as if none yet
                figures = None
        if figures is None:
            return feed_exposition((), (), (), None, math.inf, ()) + work_exposition(
                (), None, OPEN_COUNT_CAP
            )
        return feed_exposition(
            figures.events,
            figures.alarms,
            figures.lags,
            figures.oldest_unknown,
            max(0.0, self._clock() - figures.read_at),
            figures.stalls,
        ) + work_exposition(figures.open_operations, figures.purge_backlog, OPEN_COUNT_CAP)

    def close(self) -> None:
        """Let another worker read the figures."""
        self._shelf.close()
