"""Retention of a timestamp feed's receipts against an audit walk under way (service/store/
retention.py ``_FORGET_RECEIPTS``), real PostgreSQL: a walk keeps its place (``walk_after``)
when the closed timestamp jumps after a long hold, and reads on to the new closed timestamp,
so a receipt behind the audit window but after that place stays until the walk passes it."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.observer import AUDIT_EVERY, PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    event,
    foreign,
    observer,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)
from tests.integration.test_feed_retention import (
    DAY,
    KEEP,
    WINDOW,
    kept,
    purger,
    receipt,
    retention,
)
from tests.integration.test_feed_walks import Trickled, walk_place, walked

pytestmark = pytest.mark.integration


async def test_a_timestamp_feeds_receipts_stay_until_an_audit_walk_under_way_passes_them(
    engine: AsyncEngine, clock: Clock, feed_store: FeedStore, feed_name: str
) -> None:
    """Closed through 10,000 with a window of 300: receipts decided long ago at 0 to 9,650
    are all behind the window. A walk from the start (-1) keeps every one; a walk after
    9,000 keeps those after 9,000; after 9,600, those after 9,600; once no walk is under way,
    those more than the window behind the closed timestamp go, and the one at the window's
    edge stays."""
    await set_checkpoint(
        engine, feed_name, "timestamp", closed_through_timestamp=10_000, walk_after=-1
    )
    old = KEEP + 1
    stamps = {"zero": 0, "walked": 8_999, "at-place": 9_000, "ahead": 9_001}
    stamps |= {"ahead-far": 9_500, "passed-last": 9_650, "edge": 10_000 - WINDOW}
    for name, stamp in stamps.items():
        await receipt(engine, feed_name, name, stamp, "applied", old, clock)
    policy = retention(**{feed_name: WINDOW})

    await purger(engine, clock, policy).run_once()
    assert await kept(engine, feed_name) == set(stamps)  # the walk reads from the start

    await feed_store.checkpoints.walk_to(feed_name, cursor=None, after=9_000)
    await purger(engine, clock, policy).run_once()
    assert await kept(engine, feed_name) == {"ahead", "ahead-far", "passed-last", "edge"}

    await feed_store.checkpoints.walk_to(feed_name, cursor=None, after=9_600)
    await purger(engine, clock, policy).run_once()
    assert await kept(engine, feed_name) == {"passed-last", "edge"}

    await feed_store.checkpoints.walk_to(feed_name, cursor=None, after=None)  # the walk is through
    await purger(engine, clock, policy).run_once()
    assert await kept(engine, feed_name) == {"edge"}  # the next walk reads from the edge


async def test_a_closed_timestamp_jumping_under_an_audit_walk_leaves_the_walk_its_receipts(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """A hold at 1000 keeps the closed timestamp at 999 for longer than the retention, with
    the audit (a source serving two events a page) under way after 899; the hold is settled
    and the closed timestamp jumps to 5001; a purge runs; the walk's next page reads after
    899 and finds the receipts of 900 and 950: no false late-event alarm. Once the walk has
    passed them (and the next one starts one window behind 5001), they go."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    policy = retention(**{feed_name: WINDOW})
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=700)
    paid = [await unknown_payout(store, principal_id, clock) for _ in range(5)]
    later = str(uuid.uuid4())
    feed = Trickled(spec, cap=2)
    stamps = [800, 900, 950, 5000, 5001]
    feed.events = [event(op, f"p{t}", timestamp=t) for op, t in zip(paid, stamps, strict=True)]
    feed.events.insert(3, foreign("h1000", later, timestamp=1000))  # held: not here yet
    feed.watermark = 5001
    watcher = observer(
        spec, feed, store, feed_store, engine, clock, page_size=2, audit_window=WINDOW
    )
    # closes through 800, 900, 950, 999; then the hold blocks; the tenth request reads an
    # audit page after 999 - 300 - 1 = 698: p800 and p900, cut: the walk goes on after 899
    for _ in range(AUDIT_EVERY):
        await watcher.run_once()
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    assert (checkpoint.closed_through_timestamp, checkpoint.walk_after) == (999, 899)
    assert walked(feed) == [698]
    assert (await receipt_states(engine, feed_name))["h1000"] == "held"

    clock.advance(KEEP + DAY)
    await unknown_payout(store, principal_id, clock, new_operation_id=later)
    results = [(await watcher.run_once()).result for _ in range(3)]  # h1000 settled: the jump
    assert results == [PageResult.PROMOTED] * 3
    closed = (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp
    assert closed == 5001

    await purger(engine, clock, policy).run_once()
    # p800, which the walk has passed, goes; p900 and p950, ahead of it, stay
    left = {"p900", "p950", "h1000", "p5000", "p5001"}
    assert set(await receipt_states(engine, feed_name)) == left
    for _ in range(AUDIT_EVERY - 3):
        await watcher.run_once()

    assert walked(feed) == [698, 899]  # the walk went on after 899, up to 5001
    assert not [a for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"]
    assert await walk_place(feed_store, feed_name, "timestamp") == 949

    for _ in range(3 * AUDIT_EVERY):  # on after 949 (p950, h1000), 999, 4999: through 5001
        await watcher.run_once()
    assert walked(feed)[2:] == [949, 999, 4999]
    assert await walk_place(feed_store, feed_name, "timestamp") is None
    await purger(engine, clock, policy).run_once()
    # decided longer ago than the retention and passed: gone; the jump's receipts are young
    assert set(await receipt_states(engine, feed_name)) == {"h1000", "p5000", "p5001"}
    assert not [a for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"]
