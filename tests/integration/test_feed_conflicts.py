"""A feed stopped by a conflicting identity stays stopped while the source keeps its new
account, and resumes once an operator accepts it after review: the receipts involved are
unpinned (their outcomes stay), the page passes, and the alarm stays as the trail. The
unpinning is for that one conflict: a page that passes pins the receipt again as it served
it, and a later conflict of the event stops the feed again. An event twice in one page is no
such conflict: accepting it changes nothing. Real PostgreSQL, scripted feeds."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_events import event_digest
from service.app.observer import PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.domain.feeds import CursorPage
from service.store.feed_alarms import Accepted, InOnePage
from service.store.feed_tables import feed_receipts
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
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
    return {a.event_id: a.kind for a in await feed_store.alarms.recent(name)}


async def pins(engine: AsyncEngine, name: str) -> dict[str, bool]:
    r = feed_receipts.c
    async with engine.connect() as conn:
        rows = await conn.execute(select(r.event_id, r.pinned).where(r.feed == name))
        return {row.event_id: row.pinned for row in rows}


async def placed(engine: AsyncEngine, name: str) -> dict[str, tuple[int, bool, str]]:
    """event id -> (its receipt's place, whether it is pinned, its digest)."""
    r = feed_receipts.c
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(r.event_id, r.event_order, r.pinned, r.digest).where(r.feed == name)
        )
        return {row.event_id: (row.event_order, row.pinned, row.digest) for row in rows}


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

    accepted = await feed_store.alarms.accept_conflict(feed_name, "e1", now())

    assert isinstance(accepted, Accepted) and accepted.unpinned == ["e1"]
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("B", 3)
    assert await receipt_states(engine, feed_name) == {"e1": "applied", "e2": "applied"}
    assert await feed_settlements(engine, first.operation_id) == 1  # its outcome stays, once
    assert await feed_settlements(engine, second.operation_id) == 1
    assert await alarm_kinds(feed_store, feed_name) == {"e1": "conflict-accepted"}
    assert await feed_store.alarms.accept_conflict(feed_name, "e1", now()) is None  # nothing left


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
    assert [a.event_order for a in await feed_store.alarms.recent(feed_name)] == [5]

    accepted = await feed_store.alarms.accept_conflict(feed_name, "x", now())

    assert isinstance(accepted, Accepted) and accepted.unpinned == ["y"]  # x has no receipt yet
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

    accepted = await feed_store.alarms.accept_conflict(feed_name, "e1", now())

    assert isinstance(accepted, Accepted) and accepted.unpinned == ["e1"]
    feed.watermark = 20
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 20
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
    alarmed = await feed_store.alarms.recent(feed_name)
    assert [(a.kind, a.event_id, a.event_order) for a in alarmed] == [
        ("conflicting-identity", "e1", 2)
    ]

    refused = await feed_store.alarms.accept_conflict(feed_name, "e1", now())

    assert isinstance(refused, InOnePage)
    assert await feed_store.alarms.recent(feed_name) == alarmed  # not touched, not even counted
    assert await pins(engine, feed_name) == {"e1": True, "e2": True}


async def test_an_accepted_move_is_pinned_where_it_passed_and_a_later_move_stops_again(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """e1 moved from 1 to 2 is accepted, and passes at 2 in the very page that stopped: its
    receipt is pinned at 2. The source moving it again, to 4, stops the feed with a new
    alarm."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    first, second, third = [await unknown_payout(store, principal_id, clock) for _ in range(3)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(first, "e1", position=1)], next_cursor="A")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    moved = event(first, "e1", position=2)
    feed.cursor_pages["A"] = CursorPage(
        events=[moved, event(second, "e2", position=3)], next_cursor="B"
    )
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert isinstance(await feed_store.alarms.accept_conflict(feed_name, "e1", now()), Accepted)
    assert (await placed(engine, feed_name))["e1"] == (1, False, event_digest(moved))

    assert (await watcher.run_once()).result is PageResult.PROMOTED

    assert (await placed(engine, feed_name))["e1"] == (2, True, event_digest(moved))
    feed.cursor_pages["B"] = CursorPage(
        events=[event(first, "e1", position=4), event(third, "e3", position=5)], next_cursor="C"
    )
    for _ in range(2):
        assert (await watcher.run_once()).result is PageResult.STOPPED
    alarms = {a.kind: a for a in await feed_store.alarms.recent(feed_name)}
    assert set(alarms) == {"conflicting-identity", "conflict-accepted"}
    again = alarms["conflicting-identity"]
    assert (again.event_id, again.event_order, again.count) == ("e1", 4, 2)
    assert "seen at position 2, now at 4" in again.detail
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("B", 3)
    assert await receipt_states(engine, feed_name) == {"e1": "applied", "e2": "applied"}
    assert await feed_settlements(engine, first.operation_id) == 1


async def test_an_unpinned_owner_is_pinned_again_where_it_is_served_next(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """x at y's position 5 is accepted: y is unpinned, x takes 5. When the source serves y
    again (at 6) the page passes and y is pinned at 6; served at 7 later, it stops the feed."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    owner, newcomer = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(owner, "y", position=5)], next_cursor="A")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    feed.cursor_pages["A"] = CursorPage(events=[event(newcomer, "x", position=5)], next_cursor="B")
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert isinstance(await feed_store.alarms.accept_conflict(feed_name, "x", now()), Accepted)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    pins_now = {k: v[:2] for k, v in (await placed(engine, feed_name)).items()}
    assert pins_now == {"y": (5, False), "x": (5, True)}  # y not served: as accepted

    y_later = event(owner, "y", position=6)
    feed.cursor_pages["B"] = CursorPage(events=[y_later], next_cursor="C")
    assert (await watcher.run_once()).result is PageResult.PROMOTED

    assert (await placed(engine, feed_name))["y"] == (6, True, event_digest(y_later))
    feed.cursor_pages["C"] = CursorPage(events=[event(owner, "y", position=7)], next_cursor="D")
    assert (await watcher.run_once()).result is PageResult.STOPPED
    again = [
        a for a in await feed_store.alarms.recent(feed_name) if a.kind == "conflicting-identity"
    ]
    assert [(a.event_id, a.event_order) for a in again] == [("y", 7)]
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).resume_cursor == "C"
    assert await feed_settlements(engine, owner.operation_id) == 1


async def test_an_accepted_content_is_pinned_and_other_content_or_place_stops_again(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """A timestamp feed: e1's other content is accepted and pinned as served; the first
    content back, or e1 at another timestamp, stops the feed again."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    paid = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    original = event(paid, "e1", timestamp=10)
    feed.events = [original]
    feed.watermark = 9
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    await watcher.run_once()
    other = foreign("e1", timestamp=10)
    feed.events = [other]
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert isinstance(await feed_store.alarms.accept_conflict(feed_name, "e1", now()), Accepted)

    assert (await watcher.run_once()).result is PageResult.CAUGHT_UP  # passes; 10 stays open

    assert await placed(engine, feed_name) == {"e1": (10, True, event_digest(other))}
    for served_again, said in (
        (original, "other content"),
        (foreign("e1", timestamp=11), "seen at timestamp 10, now at 11"),
    ):
        feed.events = [served_again]
        assert (await watcher.run_once()).result is PageResult.STOPPED
        alarms = {a.kind: a for a in await feed_store.alarms.recent(feed_name)}
        assert set(alarms) == {"conflicting-identity", "conflict-accepted"}
        assert said in alarms["conflicting-identity"].detail
        assert await placed(engine, feed_name) == {"e1": (10, True, event_digest(other))}
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 9
    assert await receipt_states(engine, feed_name) == {"e1": "applied"}
    assert await feed_settlements(engine, paid.operation_id) == 1


async def test_a_page_stopped_for_another_reason_pins_nothing_again(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """After the acceptance the source serves e1 at 2 and then a regression: the page stops
    and e1 stays unpinned; served in order, the page passes and pins it."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(first, "e1", position=1)], next_cursor="A")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    moved = event(first, "e1", position=3)
    feed.cursor_pages["A"] = CursorPage(events=[moved], next_cursor="B")
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert isinstance(await feed_store.alarms.accept_conflict(feed_name, "e1", now()), Accepted)
    feed.cursor_pages["A"] = CursorPage(
        events=[moved, event(second, "e2", position=2)], next_cursor="B"
    )

    assert (await watcher.run_once()).result is PageResult.STOPPED

    kinds = {a.kind for a in await feed_store.alarms.recent(feed_name)}
    assert kinds == {"regression", "conflict-accepted"}
    assert await placed(engine, feed_name) == {"e1": (1, False, event_digest(moved))}
    feed.cursor_pages["A"] = CursorPage(events=[moved], next_cursor="B")
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert await placed(engine, feed_name) == {"e1": (3, True, event_digest(moved))}
