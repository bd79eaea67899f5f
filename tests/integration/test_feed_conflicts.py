"""A feed stopped by a conflicting identity stays stopped while the source keeps its new
account, and resumes once an operator accepts it after review: the receipts involved are
unpinned (their outcomes stay), the page passes, and the alarm stays as the trail. An event
twice in one page is no such conflict: accepting it changes nothing. Real PostgreSQL,
scripted feeds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.observer import PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.domain.feeds import CursorPage
from service.store.feed_alarms import InOnePage
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from service.store.tables import feed_receipts
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    ScriptedFeed,
    event,
    feed_settlements,
    foreign,
    observer,
    receipt_states,
    unknown_payout,
)

pytestmark = pytest.mark.integration


def now() -> datetime:
    return datetime.now(UTC)


async def alarm_kinds(feed_store: FeedStore, name: str) -> dict[str, str]:
    return {a.event_id: a.kind for a in await feed_store.alarms(name)}


async def pins(engine: AsyncEngine, name: str) -> dict[str, bool]:
    r = feed_receipts.c
    async with engine.connect() as conn:
        rows = await conn.execute(select(r.event_id, r.pinned).where(r.feed == name))
        return {row.event_id: row.pinned for row in rows}


async def test_an_event_served_at_another_position_stops_the_feed_until_accepted(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(first, "e1", position=1)], next_cursor="A")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    # the source renumbers: e1 is now at 2, and e2 follows it, served again from the start
    feed.cursor_pages["A"] = CursorPage(
        events=[event(first, "e1", position=2), event(second, "e2", position=3)], next_cursor="B"
    )
    for _ in range(2):  # it stays stopped while the source keeps its account
        assert (await watcher.run_once()).result is PageResult.STOPPED
    assert await alarm_kinds(feed_store, feed_name) == {"e1": "conflicting-identity"}

    accepted = await feed_store.accept_conflict(feed_name, "e1", now())

    assert accepted is not None and accepted.unpinned == ["e1"]
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    checkpoint = await feed_store.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("B", 3)
    assert await receipt_states(engine, feed_name) == {"e1": "applied", "e2": "applied"}
    assert await feed_settlements(engine, first.operation_id) == 1  # its outcome stays, once
    assert await feed_settlements(engine, second.operation_id) == 1
    assert await alarm_kinds(feed_store, feed_name) == {"e1": "conflict-accepted"}
    assert await feed_store.accept_conflict(feed_name, "e1", now()) is None  # nothing left


async def test_another_event_at_a_served_position_is_accepted_by_unpinning_the_owner(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    owner, newcomer = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(owner, "y", position=5)], next_cursor="A")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    feed.cursor_pages["A"] = CursorPage(events=[event(newcomer, "x", position=5)], next_cursor="B")
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert [a.event_order for a in await feed_store.alarms(feed_name)] == [5]

    accepted = await feed_store.accept_conflict(feed_name, "x", now())

    assert accepted is not None and accepted.unpinned == ["y"]  # x has no receipt yet
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert await receipt_states(engine, feed_name) == {"y": "applied", "x": "applied"}
    assert await feed_settlements(engine, newcomer.operation_id) == 1


async def test_a_settled_event_served_with_other_content_resumes_once_accepted(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """A timestamp feed serves a settled event again with other content; accepted, the
    outcome the first content decided stays and nothing is settled again."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    paid = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    feed.events = [event(paid, "e1", timestamp=10)]
    feed.watermark = 9
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    await watcher.run_once()
    assert await receipt_states(engine, feed_name) == {"e1": "applied"}
    feed.events = [foreign("e1", timestamp=10)]  # the same id, other evidence
    assert (await watcher.run_once()).result is PageResult.STOPPED

    accepted = await feed_store.accept_conflict(feed_name, "e1", now())

    assert accepted is not None and accepted.unpinned == ["e1"]
    feed.watermark = 20
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert (await feed_store.checkpoint(feed_name, "timestamp")).closed_through_timestamp == 20
    assert await receipt_states(engine, feed_name) == {"e1": "applied"}
    assert await feed_settlements(engine, paid.operation_id) == 1


async def test_an_event_twice_in_one_page_cannot_be_accepted_and_nothing_changes(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """e1 served at 1 and again at 2 (where e2's receipt is) in one page: accepting it would
    unpin both receipts and still leave the page stopped; it is refused, and the alarm and
    the receipts stay as they were."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    in_order = [event(first, "e1", position=1), event(second, "e2", position=2)]
    feed.cursor_pages[""] = CursorPage(events=in_order, next_cursor="A")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    feed.cursor_pages["A"] = CursorPage(
        events=[*in_order, event(first, "e1", position=2)], next_cursor="B"
    )
    assert (await watcher.run_once()).result is PageResult.STOPPED
    alarmed = await feed_store.alarms(feed_name)
    assert [(a.kind, a.event_id, a.event_order) for a in alarmed] == [
        ("conflicting-identity", "e1", 2)
    ]

    refused = await feed_store.accept_conflict(feed_name, "e1", now())

    assert isinstance(refused, InOnePage)
    assert await feed_store.alarms(feed_name) == alarmed  # not touched, not even counted
    assert await pins(engine, feed_name) == {"e1": True, "e2": True}
