"""The walks behind a feed's checkpoint (docs/design.md §8): what the main pages can no longer show.

* **Reconciliation pass** (cursor feeds): the feed read again up to the applied position,
  ``MAX_PAGE`` events a page: from its start for a source that may backfill anywhere, from
  the checkpoint the observer promoted to one audit window ago for one that promises
  ``no-backfill`` (the promise is checked, not trusted). An event behind the applied
  position without a receipt is a backfill: alarmed and processed, never skipped.
* **Late-event audit** (timestamp feeds): the audit window behind the closed timestamp, read
  through to it; an event there without a receipt arrived late: alarmed and processed.

Each page gets a main page's checks (order, identity, content). Where each walk reads next
is kept on the checkpoint's row, so a restarted observer (or another one) goes on from
there; a walk never moves past an event it did not decide. The observer says when a page
of the walk is due; a page the source does not give never stops the feed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from service.app.feed_events import FeedEvents, event_digest, event_order
from service.config import FeedSpec
from service.core.feed import (
    FeedEvent,
    Stop,
    check_cursor_page,
    check_timestamp_page,
    found_by,
)
from service.domain.feeds import FeedClient, FeedUnavailable
from service.store.feed_checkpoints import Checkpoint
from service.store.feeds import FeedStore

__all__ = ["MAX_PAGE", "WALK_FAILURES", "FeedWalks"]

log = logging.getLogger("settlement.observer")

# The largest page asked for: the walks' pages, and the most a tie group may grow a main
# page to (a tie group larger than this stalls the feed: an alarm).
MAX_PAGE = 500
# Walk pages in a row the source does not give before the walk starts anew (the place it
# kept, an old cursor, may be what the source refuses).
WALK_FAILURES = 3


class FeedWalks:
    def __init__(
        self,
        spec: FeedSpec,
        client: FeedClient,
        feeds: FeedStore,
        events: FeedEvents,
        *,
        clock: Callable[[], float],
        audit_window: float,
    ) -> None:
        """``audit_window``: how far back the walks read (a timestamp feed: behind its closed
        timestamp; a cursor feed promising no-backfill: from its checkpoint of that long
        ago)."""
        self.spec = spec
        self._client = client
        self._feeds = feeds
        self._events = events
        self._clock = clock
        self._window = int(audit_window)
        self._failures = 0  # walk pages in a row the source did not give
        # (clock, cursor): the checkpoint the observer started at and those a page was
        # promoted to since, by it or by another observer, oldest first, kept for one audit
        # window: a no-backfill cursor feed is read again from one a window old. A token
        # adopted from an empty page is never one (it could skip events)
        self._marks: deque[tuple[float, str]] = deque()

    def at_checkpoint(self, checkpoint: Checkpoint) -> None:
        """The checkpoint as a page reads it: the cursor a page was last promoted to is
        remembered as of now, whoever promoted (an observer that never wins a promotion
        still moves its passes' base on, as far as the retention purge lets receipts go:
        R3). Another observer's promotion is seen after it was made, so its mark is dated
        late and the base it gives is never newer than the one a promoting observer has. A
        row written before migration 0013 has no such cursor: its ``resume_cursor`` stands
        in as the first mark only (it may be a token adopted from an empty page)."""
        if checkpoint.promoted_cursor is not None or not self._marks:
            self.promoted_to(checkpoint.start_cursor)

    def promoted_to(self, cursor: str) -> None:
        """Remember a cursor the observer promoted to, as of now (once per cursor),
        forgetting those more than one audit window older than the newest a window old."""
        now = self._clock()
        if not self._marks or self._marks[-1][1] != cursor:
            self._marks.append((now, cursor))
        self._forget_marks(now)

    def _forget_marks(self, now: float) -> None:
        """Forget the marks older than the newest one at least a window old: on promotion,
        and when a pass starts (a feed that promotes no more still moves its base on)."""
        while len(self._marks) > 1 and self._marks[1][0] <= now - self._window:
            self._marks.popleft()

    async def page(self, checkpoint: Checkpoint) -> None:
        """One page of the feed's walk. A page the source does not give is logged and
        skipped (a walk that cannot go on never stops the feed); after ``WALK_FAILURES`` in
        a row the walk starts anew, in case the place it kept is what the source refuses."""
        try:
            if self.spec.kind == "cursor":
                await self._reconcile_page(checkpoint)
            else:
                await self._audit_page(checkpoint)
        except FeedUnavailable as exc:
            self._failures += 1
            log.warning(
                "feed walk page unavailable",
                extra={"feed": self.spec.name, "error": str(exc), "in_a_row": self._failures},
            )
            if self._failures >= WALK_FAILURES:
                self._failures = 0
                await self._feeds.checkpoints.walk_to(self.spec.name, cursor=None, after=None)
        else:
            self._failures = 0

    # -- the reconciliation pass (cursor feeds) -------------------------------------------------

    def _reconcile_start(self) -> str:
        """Where a pass reads from: a feed whose source may backfill anywhere, its start; a
        feed promising no-backfill, the checkpoint promoted to one audit window ago (or
        started at, if the observer has run for less)."""
        if "no-backfill" not in self.spec.promises:
            return ""
        self._forget_marks(self._clock())
        return self._marks[0][1]

    async def _reconcile_page(self, checkpoint: Checkpoint) -> None:
        """One page of the pass, up to the applied position; at the applied position (or the
        feed's end) the pass starts again."""
        applied = checkpoint.applied_position
        if applied is None:
            return
        cursor = checkpoint.walk_cursor
        if cursor is None:
            cursor = self._reconcile_start()
        page = await self._client.cursor_page(cursor, MAX_PAGE)
        behind = [e for e in page.events if event_order(e.position) <= applied]
        events = [FeedEvent(e.event_id, event_order(e.position), event_digest(e)) for e in behind]
        name = self.spec.name
        seen = await self._feeds.receipts.seen(name, [e.event_id for e in events])
        owners = await self._feeds.receipts.owners(name, [e.order for e in events])
        checked = check_cursor_page(applied, events, seen, owners)
        if isinstance(checked, Stop):
            await self._stopped(checked, "reconciliation")
            await self._feeds.checkpoints.walk_to(name, cursor=None, after=None)
            return
        alarms = [
            ("backfill", e, f"position {e.order} behind the applied prefix, found on re-reading")
            for e in checked.backfilled
        ]
        if await self._events.outcomes(name, checked.process, behind, seen, alarms) is None:
            return  # an event not decided: the walk reads this page again, never past it
        await self._events.repin(name, checked.repin, places=True)
        done = not page.events or len(behind) < len(page.events)
        done = done or page.next_cursor == cursor
        following = None if done else page.next_cursor
        if following != checkpoint.walk_cursor:
            await self._feeds.checkpoints.walk_to(name, cursor=following, after=None)

    # -- the late-event audit (timestamp feeds) -------------------------------------------------

    async def _audit_page(self, checkpoint: Checkpoint) -> None:
        """One page of the audit: through the audit window behind the closed timestamp, and
        again behind the then closed timestamp once it has passed the closed one."""
        closed = checkpoint.closed_through_timestamp
        if closed is None:
            return
        after = checkpoint.walk_after
        if after is None:
            after = max(-1, closed - self._window - 1)
        following = await self._audit_walk(closed, after)
        if following != checkpoint.walk_after:
            await self._feeds.checkpoints.walk_to(self.spec.name, cursor=None, after=following)

    async def _audit_walk(self, closed: int, after: int) -> int | None:
        """One page of the audit from ``after``; where the walk goes on (None: a new one)."""
        name = self.spec.name
        page = await self._client.timestamp_page(after if after >= 0 else None, MAX_PAGE)
        behind = [e for e in page.events if e.timestamp is not None and e.timestamp <= closed]
        events = [FeedEvent(e.event_id, event_order(e.timestamp), event_digest(e)) for e in behind]
        seen = await self._feeds.receipts.seen(name, [e.event_id for e in events])
        checked = check_timestamp_page(closed, events, seen)
        if isinstance(checked, Stop):
            await self._stopped(checked, "audit")
            return None
        alarms = [
            ("late-event", e, f"timestamp {e.order} <= closed {closed}") for e in checked.late
        ]
        if await self._events.outcomes(name, checked.process, behind, seen, alarms) is None:
            return after  # an event not decided: this page again, never past it
        await self._events.repin(name, checked.repin, places=False)
        # The walk trusts no promise of the source (it is how a broken one shows): a short
        # page may be capped, so only an empty page or one reaching the closed timestamp ends
        # it; otherwise it goes on from the page's last timestamp, which may have been cut.
        last = max((event_order(e.timestamp) for e in page.events), default=None)
        if last is None or last >= closed:
            return None  # through the closed timestamp: start again next time
        if last - 1 <= after:
            # the page is one timestamp: on past it (a full page of it cannot be paged
            # through: alarmed)
            if len(page.events) >= MAX_PAGE:
                await self._events.alarm(
                    name, "tie-stall", "", f"audit: more than {MAX_PAGE} events at timestamp {last}"
                )
            return last
        return last - 1

    async def _stopped(self, stop: Stop, walk: str) -> None:
        found = found_by(walk, stop)
        await self._events.alarm(
            self.spec.name, found.kind, found.event_id, found.detail, found.order
        )
