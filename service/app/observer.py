"""The feed observer (docs/design.md §8): one worker per feed, ``run()`` and ``run_once()``
(a page).

Each page: read the checkpoint, fetch the page it names, check the page against the
receipts (:mod:`service.core.feed`), give every new event one durable outcome, then move the
checkpoint past the page only if all its events are final (a CAS: a losing observer rereads
and never writes older progress over newer).

Each event's outcome is :class:`service.app.feed_events.FeedEvents`' to decide (applied,
ignored, quarantined, or held); a database error on the way stops the page, nothing is
promoted, and the next page retries the event.

**Holds are never forgotten.** A hold blocks the barrier while its event is in the page
being decided. The checkpoint may pass a held event the feed no longer serves at it (an
overlap or backfill page served it behind the checkpoint): the hold keeps the event, and the
observer decides its holds again by itself, at most once per ``poll_interval``, the least
recently decided first, whether or not the feed serves them again: the operation now known
settles it, the grace run out quarantines it. Holds for an operator (``bad-signature``)
wait for the operator's ``quarantine`` or ``retry``. ``GET /admin/v1/feeds/{name}/holds``
pages through every open hold with its age.

Failpoints: ``observer.event.before_commit|after_commit`` around a settled event's commit,
``observer.quarantine.before|after`` around a quarantine the observer decides,
``observer.barrier.before|after`` around the checkpoint's move.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable

import msgspec

from service.app.feed_events import FeedEvents, event_digest, event_order
from service.app.feed_walks import MAX_PAGE, FeedWalks
from service.config import FeedSpec
from service.core.feed import (
    Advance,
    Backoff,
    Blocked,
    FeedEvent,
    Promote,
    ReceiptState,
    Stop,
    check_cursor_page,
    check_timestamp_page,
    closable_through,
    cursor_barrier,
)
from service.domain.feeds import FeedClient, FeedUnavailable
from service.failpoints import Failpoints
from service.store.feed_checkpoints import Checkpoint
from service.store.feeds import FeedStore
from service.store.retention import RetentionStore
from service.store.rows import at
from service.store.settlement import SettlementStore

__all__ = ["MAX_PAGE", "FeedObserver", "Page", "PageResult"]

log = logging.getLogger("settlement.observer")

# Holds decided again per pass (a pass per poll interval at most): a feed with more open
# holds goes through them over several passes, the least recently decided first.
HOLD_BATCH = 50
# One request in this many of a busy observer also reads a page of its late-event audit
# (timestamp feeds) or of its reconciliation pass (cursor feeds): both walk what is behind
# the checkpoint a page at a time (an idle observer reads one with every request).
AUDIT_EVERY = 10


class PageResult(enum.StrEnum):
    PROMOTED = "promoted"  # the checkpoint moved past the page
    BLOCKED = "blocked"  # an event is held: the checkpoint stays
    CAUGHT_UP = "caught-up"  # nothing new
    STUCK = "stuck"  # the feed returned the request's own cursor with events pending
    STOPPED = "stopped"  # the page broke the feed's contract: alarmed, nothing moved
    LOST = "lost"  # another observer moved the checkpoint first
    UNAVAILABLE = "unavailable"  # no page, or a database error on the way
    GROW = "grow"  # one tie group filled the page: ask for a larger one


class Page(msgspec.Struct, frozen=True):
    result: PageResult
    events: int = 0
    processed: int = 0


# A page's outcome -> whether the next page may be asked for at once
_PROGRESS = {PageResult.PROMOTED, PageResult.LOST, PageResult.GROW}


class FeedObserver:
    def __init__(
        self,
        spec: FeedSpec,
        client: FeedClient,
        feeds: FeedStore,
        store: SettlementStore,
        tombstones: RetentionStore,
        *,
        secret: str | None,
        external_routes: frozenset[str],
        failpoints: Failpoints,
        clock: Callable[[], float],
        page_size: int,
        unknown_grace: float,
        poll_interval: float,
        max_backoff: float,
        audit_window: float,
    ) -> None:
        """``audit_window``: how far back a feed is read again, page after page, for events
        that arrived behind its checkpoint (a timestamp feed: behind its closed timestamp; a
        cursor feed promising no-backfill: from its checkpoint of that long ago)."""
        self.spec = spec
        self._client = client
        self._feeds = feeds
        self._events = FeedEvents(
            feeds,
            store,
            tombstones,
            secret=secret,
            external_routes=external_routes,
            failpoints=failpoints,
            clock=clock,
            unknown_grace=unknown_grace,
        )
        self._failpoints = failpoints
        self._clock = clock
        self._page_size = page_size
        self._limit = page_size
        self._poll = poll_interval
        self._next_redrive: float | None = None  # when the holds are decided again next
        self._max_backoff = max_backoff
        self._idle = 0  # pages in a row without progress: the backoff's exponent
        self._pages = 0  # pages so far: every AUDIT_EVERY-th (every one, idle) reads a walk page
        self._walks = FeedWalks(
            spec, client, feeds, self._events, clock=clock, audit_window=audit_window
        )

    async def close(self) -> None:
        await self._client.close()

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Page after page until cancelled: at once after progress; after a page without,
        wait ``poll_interval`` doubled per such page up to ``max_backoff`` (a stuck or failing
        feed is asked at most a few times a minute, never in a hot loop)."""
        while True:
            try:
                page = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("feed page failed", extra={"feed": self.spec.name})
                page = Page(PageResult.UNAVAILABLE)
            await asyncio.sleep(self.wait_after(page))

    def wait_after(self, page: Page) -> float:
        if page.result in _PROGRESS:
            self._idle = 0
            return 0.0
        self._idle += 1
        return float(min(self._max_backoff, self._poll * 2 ** min(self._idle - 1, 16)))

    async def run_once(self) -> Page:
        """One page of the feed (first, when due, the feed's holds are decided again)."""
        await self.redrive_holds()
        checkpoint = await self._feeds.checkpoints.checkpoint(self.spec.name, self.spec.kind)
        try:
            if self.spec.kind == "cursor":
                return await self._cursor_page(checkpoint)
            return await self._timestamp_page(checkpoint)
        except FeedUnavailable as exc:
            log.warning("feed unavailable", extra={"feed": self.spec.name, "error": str(exc)})
            return Page(PageResult.UNAVAILABLE)

    async def redrive_holds(self) -> int:
        """Decide the feed's holds again from the events they keep, at most once per
        ``poll_interval``; how many became final."""
        now = self._clock()
        if self._next_redrive is not None and now < self._next_redrive:
            return 0
        self._next_redrive = now + self._poll
        return await self._events.redrive(self.spec.name, HOLD_BATCH)

    # -- cursor feeds -------------------------------------------------------------------------

    async def _cursor_page(self, checkpoint: Checkpoint) -> Page:
        name = self.spec.name
        self._pages += 1
        self._walks.at_checkpoint(checkpoint)
        if self._walk_due():
            await self._walks.page(checkpoint)
        page = await self._client.cursor_page(checkpoint.resume_cursor, self._limit)
        events = [
            FeedEvent(e.event_id, event_order(e.position), event_digest(e)) for e in page.events
        ]
        seen = await self._feeds.receipts.seen(name, [e.event_id for e in events])
        owners = await self._feeds.receipts.owners(name, [e.order for e in events])
        checked = check_cursor_page(checkpoint.applied_position, events, seen, owners)
        if isinstance(checked, Stop):
            return await self._stopped(checked, len(events))
        alarms = [
            ("backfill", e, f"position {e.order} behind the applied prefix")
            for e in checked.backfilled
        ]
        outcomes = await self._events.outcomes(name, checked.process, page.events, seen, alarms)
        if outcomes is None:
            return Page(PageResult.UNAVAILABLE, len(events))
        states, processed = outcomes
        await self._events.repin(name, checked.repin, places=True)
        verdict = cursor_barrier(
            checkpoint.resume_cursor,
            page.next_cursor,
            checkpoint.applied_position,
            events,
            states,
            advance="empty-advance" in self.spec.promises,
        )
        match verdict:
            case Blocked(event_ids=held):
                log.info("feed barrier held", extra={"feed": name, "held": held[:10]})
                return Page(PageResult.BLOCKED, len(events), processed)
            case Backoff():
                if events:
                    await self._alarm("stuck-token", "", "the feed returned the request's cursor")
                    return Page(PageResult.STUCK, len(events), processed)
                if page.next_cursor != checkpoint.resume_cursor:
                    log.info(
                        "feed empty page with a new cursor not adopted (empty-advance is not "
                        "promised)",
                        extra={"feed": name},
                    )
                await self._feeds.checkpoints.caught_up(name, at(self._clock()))
                return Page(PageResult.CAUGHT_UP)
            case Advance(cursor=cursor):
                # nothing was passed: the new token is kept, the version stays, and the
                # observer backs off as on any caught-up page
                await self._feeds.checkpoints.advance_cursor(checkpoint, cursor, at(self._clock()))
                return Page(PageResult.CAUGHT_UP)
            case Promote(cursor=cursor, applied_position=applied):
                await self._failpoints.hit("observer.barrier.before")
                moved = await self._feeds.checkpoints.promote_cursor(
                    checkpoint, cursor, applied, at(self._clock())
                )
                await self._failpoints.hit("observer.barrier.after")
                if not moved:
                    log.info("feed checkpoint moved by another observer", extra={"feed": name})
                    return Page(PageResult.LOST, len(events), processed)
                self._walks.promoted_to(cursor)
                return Page(PageResult.PROMOTED, len(events), processed)
        raise AssertionError(verdict)  # pragma: no cover - the match is exhaustive

    def _walk_due(self) -> bool:
        """Whether this request also reads a page of the walk behind the checkpoint: one
        request in ``AUDIT_EVERY`` on a busy feed, every request on an idle one (the last
        page made no progress), so a walk over a long feed ends in a bounded time."""
        return self._pages % AUDIT_EVERY == 0 or self._idle > 0

    # -- timestamp feeds ----------------------------------------------------------------------

    async def _timestamp_page(self, checkpoint: Checkpoint) -> Page:
        name = self.spec.name
        closed = checkpoint.closed_through_timestamp
        limit = self._limit
        self._pages += 1
        if self._walk_due():
            await self._walks.page(checkpoint)
        page = await self._client.timestamp_page(closed, limit)
        events = [
            FeedEvent(e.event_id, event_order(e.timestamp), event_digest(e)) for e in page.events
        ]
        seen = await self._feeds.receipts.seen(name, [e.event_id for e in events])
        checked = check_timestamp_page(closed, events, seen)
        if isinstance(checked, Stop):
            return await self._stopped(checked, len(events))
        alarms = [
            ("late-event", e, f"timestamp {e.order} <= closed {closed}") for e in checked.late
        ]
        outcomes = await self._events.outcomes(name, checked.process, page.events, seen, alarms)
        if outcomes is None:
            return Page(PageResult.UNAVAILABLE, len(events))
        states, processed = outcomes
        await self._events.repin(name, checked.repin, places=False)
        promised = self.spec.promises
        # a page may be cut when it fills the limit, or when it is short but the source does
        # not promise that a short page is the whole answer (a silent cap)
        full = len(events) >= limit
        cut = full or (bool(events) and "short-page-end" not in promised)
        # only the events after the closed timestamp decide what closes next (a source whose
        # ``after`` is inclusive serves the closed timestamp's events again; a hold behind the
        # checkpoint is decided again on its own and blocks nothing ahead of it); a page that
        # may be cut and holds none of them proves nothing
        ahead = [e for e in events if closed is None or e.order > closed]
        through = (
            None
            if cut and not ahead
            else closable_through(
                closed,
                ahead,
                states,
                page.finality_watermark if "watermark" in promised else None,
                full=cut,
                later="later-timestamp" in promised,
            )
        )
        if through is None:
            fresh = {e.order for e in ahead}
            if full and len(fresh) <= 1:
                # one tie group fills the page: it cannot close until a page holds it whole
                if limit < MAX_PAGE:
                    self._limit = min(MAX_PAGE, limit * 2)
                    return Page(PageResult.GROW, len(events), processed)
                await self._alarm(
                    "tie-stall", "", f"more than {MAX_PAGE} events at timestamp {events[0].order}"
                )
                return Page(PageResult.STUCK, len(events), processed)
            if any(not _final(states.get(e.event_id)) for e in ahead):
                return Page(PageResult.BLOCKED, len(events), processed)
            if not events:
                await self._feeds.checkpoints.caught_up(name, at(self._clock()))
            return Page(PageResult.CAUGHT_UP, len(events), processed)
        await self._failpoints.hit("observer.barrier.before")
        moved = await self._feeds.checkpoints.close_through(checkpoint, through, at(self._clock()))
        await self._failpoints.hit("observer.barrier.after")
        self._limit = self._page_size
        if not moved:
            return Page(PageResult.LOST, len(events), processed)
        return Page(PageResult.PROMOTED, len(events), processed)

    # -- alarms -------------------------------------------------------------------------------

    async def _stopped(self, stop: Stop, events: int) -> Page:
        await self._alarm(stop.kind, stop.event_id, stop.detail, stop.order)
        return Page(PageResult.STOPPED, events)

    async def _alarm(self, kind: str, event_id: str, detail: str, order: int | None = None) -> None:
        await self._events.alarm(self.spec.name, kind, event_id, detail, order)


def _final(state: ReceiptState | None) -> bool:
    return state is not None and state.final
