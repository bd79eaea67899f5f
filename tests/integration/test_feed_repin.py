"""Pinning an accepted event's receipt again, against real PostgreSQL: a stale observer
that checked an older page after an operator accepted the event's conflict, and writes after
another observer decided a newer one, neither moves the receipt from where the newer page
pinned it nor pins it at a place another event has taken meanwhile; and a conflict the
late-event audit found and an operator accepted is pinned again by the audit's next page.
Interleavings are forced with a failpoint that waits, never with sleeps."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_events import event_digest
from service.app.observer import PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.domain.feeds import CursorPage
from service.store.feed_alarms import Accepted
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_conflicts import now, placed
from tests.integration.test_feed_observer import (
    ScriptedFeed,
    event,
    foreign,
    observer,
    unknown_payout,
)
from tests.integration.test_feed_stale import QUEUE_WAIT, Gate

pytestmark = pytest.mark.integration


async def accepted_move(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> tuple[Any, Any, Gate, ScriptedFeed, list[Any]]:
    """A cursor feed that served e1 at 1, then at 2 (stopped, accepted: e1 unpinned at 1);
    two observers, each with its own view of the source: ``stale`` (waiting after the first
    event it commits) and ``fresh``."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    ops = [await unknown_payout(store, principal_id, clock) for _ in range(3)]
    stale_feed, fresh_feed = ScriptedFeed(spec), ScriptedFeed(spec)
    for feed in (stale_feed, fresh_feed):
        feed.cursor_pages[""] = CursorPage(
            events=[event(ops[0], "e1", position=1)], next_cursor="A"
        )
        feed.cursor_pages["A"] = CursorPage(
            events=[event(ops[0], "e1", position=2)], next_cursor="B"
        )
    gate = Gate("observer.event.after_commit")
    stale = observer(spec, stale_feed, store, feed_store, engine, clock, failpoints=gate)
    fresh = observer(spec, fresh_feed, store, feed_store, engine, clock)
    assert (await fresh.run_once()).result is PageResult.PROMOTED
    assert (await fresh.run_once()).result is PageResult.STOPPED
    assert isinstance(await feed_store.alarms.accept_conflict(feed_name, "e1", now()), Accepted)
    # the stale observer's page: e1 at 2, and e2 (new) at 3, where it waits once e2 is decided
    stale_feed.cursor_pages["A"] = CursorPage(
        events=[event(ops[0], "e1", position=2), event(ops[1], "e2", position=3)],
        next_cursor="B",
    )
    return stale, fresh, gate, fresh_feed, ops


async def test_a_stale_observer_never_moves_a_receipt_pinned_again_by_a_newer_page(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """The stale observer checked e1 at 2; meanwhile the fresh one is served e1 at 4 and pins
    it there. The stale write finds e1 pinned and changes nothing; its checkpoint move loses."""
    stale, fresh, gate, fresh_feed, ops = await accepted_move(
        engine, store, feed_store, clock, principal_id, feed_name
    )
    late = asyncio.create_task(stale.run_once())
    await asyncio.wait_for(gate.reached.wait(), QUEUE_WAIT)
    moved = event(ops[0], "e1", position=4)
    fresh_feed.cursor_pages["A"] = CursorPage(events=[moved], next_cursor="C")
    assert (await fresh.run_once()).result is PageResult.PROMOTED
    assert (await placed(engine, feed_name))["e1"][:2] == (4, True)

    gate.release.set()
    assert (await late).result is PageResult.LOST

    assert (await placed(engine, feed_name))["e1"][:2] == (4, True)
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C", 4)


async def test_a_stale_observer_never_pins_a_receipt_at_a_place_taken_meanwhile(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """The stale observer checked e1 at 2; meanwhile the fresh one is served x at 2 and gives
    it its receipt there. The stale write leaves e1 unpinned (position 2 is x's); the source
    serving e1 again, at 4, pins it there."""
    stale, fresh, gate, fresh_feed, ops = await accepted_move(
        engine, store, feed_store, clock, principal_id, feed_name
    )
    late = asyncio.create_task(stale.run_once())
    await asyncio.wait_for(gate.reached.wait(), QUEUE_WAIT)
    fresh_feed.cursor_pages["A"] = CursorPage(
        events=[event(ops[2], "x", position=2)], next_cursor="C"
    )
    assert (await fresh.run_once()).result is PageResult.PROMOTED

    gate.release.set()
    assert (await late).result is PageResult.LOST

    pins = {k: v[:2] for k, v in (await placed(engine, feed_name)).items()}
    assert pins == {"e1": (1, False), "e2": (3, True), "x": (2, True)}
    fresh_feed.cursor_pages["C"] = CursorPage(
        events=[event(ops[0], "e1", position=4)], next_cursor="D"
    )
    assert (await fresh.run_once()).result is PageResult.PROMOTED
    assert (await placed(engine, feed_name))["e1"][:2] == (4, True)


async def test_a_conflict_the_audit_found_is_pinned_again_by_the_audits_next_page(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """Behind the closed timestamp only the audit serves e1 again: with other content it is
    alarmed; accepted, the audit's next page pins e1 with it, and the first content back
    is alarmed again."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    paid = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    original = event(paid, "e1", timestamp=10)
    feed.events, feed.watermark = [original], 20
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED  # closed through 20
    other = foreign("e1", timestamp=10)
    feed.events = [other]
    watcher.wait_after(await watcher.run_once())  # idle: each request reads an audit page
    await watcher.run_once()
    alarms = await feed_store.alarms.recent(feed_name)
    assert [(a.kind, a.detail.split(":")[0]) for a in alarms] == [("conflicting-identity", "audit")]
    assert isinstance(await feed_store.alarms.accept_conflict(feed_name, "e1", now()), Accepted)

    await watcher.run_once()

    assert await placed(engine, feed_name) == {"e1": (10, True, event_digest(other))}
    feed.events = [original]
    await watcher.run_once()
    kinds = {a.kind for a in await feed_store.alarms.recent(feed_name)}
    assert kinds == {"conflicting-identity", "conflict-accepted"}
    assert await placed(engine, feed_name) == {"e1": (10, True, event_digest(other))}
