"""The walks behind a feed's checkpoint (service/app/feed_walks.py) on either feed kind: a
walk page whose event is left without an outcome is read again, a timestamp feed's audit
page the source refuses, an idle timestamp observer's audit, and the audit's kept place
across a restart. Real PostgreSQL, scripted feeds."""

from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_walks import WALK_FAILURES
from service.app.observer import AUDIT_EVERY, MAX_PAGE, PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.domain.feeds import CursorPage, FeedUnavailable, TimestampPage
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    CountingFailpoints,
    ScriptedFeed,
    event,
    feed_settlements,
    foreign,
    observer,
    promised,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)

pytestmark = pytest.mark.integration


def walked(feed: ScriptedFeed) -> list[object]:
    """Where each page of the walk was asked from (a walk asks for pages of MAX_PAGE; the
    main pages here are smaller)."""
    return [where for where, limit in feed.asked if limit == MAX_PAGE]


async def walk_place(feed_store: FeedStore, name: str, kind: str) -> object:
    checkpoint = await feed_store.checkpoints.checkpoint(name, kind)
    return checkpoint.walk_cursor if kind == "cursor" else checkpoint.walk_after


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
async def test_a_walk_page_with_an_event_left_undecided_keeps_its_place_and_is_read_again(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    kind: str,
) -> None:
    """A walk page behind the checkpoint (a cursor feed's reconciliation pass from R1; a
    timestamp feed's audit after 900) holds a payout's event and a stranger's, neither with
    a receipt. Deciding the payout's event fails once, before its commit: nothing on the
    page gets an outcome, the walk keeps its place and the main page is read all the same.
    The next request reads that page again, decides both, and only then does the walk go on
    (R2; after 959)."""
    spec = FeedSpec(feed_name, kind, f"http://feed.invalid/{kind}", promised(kind))
    paid = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    if kind == "cursor":
        await set_checkpoint(
            engine, feed_name, kind, resume_cursor="C30", applied_position=30, walk_cursor="R1"
        )
        feed.cursor_pages["R1"] = CursorPage(
            events=[event(paid, "b20", position=20), foreign("b25", position=25)],
            next_cursor="R2",
        )
        kept, onward = "R1", "R2"
    else:
        await set_checkpoint(engine, feed_name, kind, closed_through_timestamp=1000, walk_after=900)
        feed.events = [event(paid, "b20", timestamp=950), foreign("b25", timestamp=960)]
        kept, onward = 900, 959  # the page may be cut: on from its last timestamp - 1
    failing = CountingFailpoints("observer.event.before_commit", nth=1)
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, failpoints=failing)
    # the first request (busy so far) reads no walk page; from the second on (idle) each does
    watcher.wait_after(await watcher.run_once())

    page = await watcher.run_once()
    watcher.wait_after(page)
    assert failing.hits == 1 and page.result is PageResult.CAUGHT_UP
    assert walked(feed) == [kept]
    assert await receipt_states(engine, feed_name) == {}
    assert await walk_place(feed_store, feed_name, kind) == kept  # not past b20, undecided

    await watcher.run_once()
    assert walked(feed) == [kept, kept]  # the same page again
    assert await receipt_states(engine, feed_name) == {"b20": "applied", "b25": "quarantined"}
    assert await feed_settlements(engine, paid.operation_id) == 1
    assert await walk_place(feed_store, feed_name, kind) == onward


class AuditRefused(ScriptedFeed):
    """A timestamp source that gives the main pages but refuses every page of the audit
    (500 events) while ``refusing``."""

    refusing = True

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        if limit == MAX_PAGE and self.refusing:
            self.asked.append((after, limit))
            raise FeedUnavailable("feed: HTTP 400")
        return await super().timestamp_page(after, limit)


async def test_an_audit_the_source_refuses_never_stops_the_feed_and_starts_anew(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every audit page fails (the kept ``walk_after`` of 50 is one the source no longer
    takes, say): each refusal is logged and skipped, every request reads its main page all
    the same, and after WALK_FAILURES in a row the kept place is dropped: the next audit
    starts anew, one audit window behind the closed timestamp."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    paid = [await unknown_payout(store, principal_id, clock) for _ in range(3)]
    await set_checkpoint(
        engine, feed_name, "timestamp", closed_through_timestamp=100, walk_after=50
    )
    feed = AuditRefused(spec)
    feed.events = [event(op, f"e{n}", timestamp=101 + n) for n, op in enumerate(paid)]
    feed.watermark = 103
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, audit_window=20)
    results = []
    with caplog.at_level(logging.WARNING, logger="settlement.observer"):
        for _ in range(2 + WALK_FAILURES):
            page = await watcher.run_once()
            results.append(page.result)
            watcher.wait_after(page)
    # the first page closes through the watermark; the second is caught up (no audit page
    # yet: busy so far); idle from then on, each request reads an audit page, refused
    assert results == [PageResult.PROMOTED] + [PageResult.CAUGHT_UP] * (1 + WALK_FAILURES)
    assert walked(feed) == [50] * WALK_FAILURES
    main = [after for after, limit in feed.asked if limit != MAX_PAGE]
    assert main == [100] + [103] * (1 + WALK_FAILURES)  # one main page with every request
    refused = [r for r in caplog.records if r.getMessage() == "feed walk page unavailable"]
    assert len(refused) == WALK_FAILURES
    assert await receipt_states(engine, feed_name) == {f"e{n}": "applied" for n in range(3)}
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    assert (checkpoint.closed_through_timestamp, checkpoint.walk_after) == (103, None)

    feed.refusing = False
    await watcher.run_once()
    assert walked(feed) == [50] * WALK_FAILURES + [103 - 20 - 1]  # anew, not from 50


async def test_an_idle_timestamp_feed_reads_a_page_of_its_audit_with_every_request(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """A timestamp feed with nothing new: its first request (busy so far) reads no audit
    page, and from the second on, its last page having made no progress, every request
    reads one, so the audit over its window ends in bounded time."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=1000)
    feed = ScriptedFeed(spec)
    feed.events = [foreign(f"x{n}", timestamp=990 + n) for n in range(5)]
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    audits = []
    for _ in range(4):
        page = await watcher.run_once()
        assert page.result is PageResult.CAUGHT_UP
        watcher.wait_after(page)
        audits.append(len(walked(feed)))
    assert audits == [0, 1, 2, 3]
    assert walked(feed)[0] == 1000 - 300 - 1  # one audit window behind the closed timestamp
    late = {a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"}
    assert late == {f"x{n}" for n in range(5)}  # the audit read them: late, each alarmed


class Trickled(ScriptedFeed):
    """A timestamp source that serves at most ``cap`` events a page, whatever the limit
    asked: an audit page (asked for 500) ends short of the closed timestamp, and the walk
    goes on from its last timestamp."""

    def __init__(self, spec: FeedSpec, cap: int) -> None:
        super().__init__(spec)
        self.cap = cap

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        page = await super().timestamp_page(after, limit)
        return TimestampPage(events=page.events[: self.cap], finality_watermark=self.watermark)


async def test_an_audit_goes_on_where_it_was_after_a_restart(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """Where the audit reads next (``walk_after``) is kept on the checkpoint's row: an
    observer started anew on the feed goes on from there, not from one audit window behind
    the closed timestamp (one restarted more often than a walk takes would otherwise never
    reach the closed timestamp)."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=1000)
    feed = Trickled(spec, cap=2)
    feed.events = [foreign(name, timestamp=stamp) for name, stamp in [("x", 750), ("y", 800)]]
    feed.events.append(foreign("z", timestamp=900))  # none has a receipt: each is late
    before = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    for _ in range(AUDIT_EVERY):
        await before.run_once()
    assert walked(feed) == [1000 - 300 - 1]
    assert await walk_place(feed_store, feed_name, "timestamp") == 799  # on from y's, cut

    after = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)  # a restart
    for _ in range(AUDIT_EVERY):
        await after.run_once()

    assert walked(feed) == [699, 799]  # on from the kept place, not 699 again
    assert await receipt_states(engine, feed_name) == {n: "quarantined" for n in "xyz"}
    late = [a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"]
    assert sorted(late) == ["x", "y", "z"]
    assert await walk_place(feed_store, feed_name, "timestamp") == 899
