"""A token adopted from an empty page is never where an observer's reconciliation passes
start (docs/feed-rules.md P12): a source that promises ``empty-advance`` and ``no-backfill``
and breaks the first serves an empty page whose token skips waiting events; an observer that
starts at the checkpoint holding that token still reads again from the cursor a page was
last promoted to, and finds them. Real PostgreSQL, scripted feeds."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.observer import AUDIT_EVERY, MAX_PAGE, PageResult
from service.config import FeedSpec
from service.domain.feeds import CursorPage
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    ScriptedFeed,
    event,
    feed_settlements,
    observer,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)

pytestmark = pytest.mark.integration

BOTH = frozenset({"empty-advance", "no-backfill"})


async def test_an_observer_started_at_an_adopted_token_still_finds_the_events_it_skipped(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """One observer adopts an empty page's token that skips two waiting events; another (a
    restart, or a second process) starts at that checkpoint. Its first mark is C10, the
    cursor a page was promoted to, not the token: once a later event moves the applied
    position past them, its pass finds both, alarmed as backfills, each decided once, and
    the first observer reading again after it decides neither twice."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", BOTH)
    first, s20, s25, later = [await unknown_payout(store, principal_id, clock) for _ in range(4)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(first, "e10", position=10)], next_cursor="C10")
    # s20 and s25 wait, but the page after C10 is empty with a token past them
    feed.cursor_pages["C10"] = CursorPage(events=[], next_cursor="T")
    adopter = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    assert (await adopter.run_once()).result is PageResult.PROMOTED
    promoted = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (await adopter.run_once()).result is PageResult.CAUGHT_UP
    adopted = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (adopted.resume_cursor, adopted.promoted_cursor) == ("T", "C10")
    assert adopted.version == promoted.version  # nothing was passed

    # read again from C10, the source serves what it skipped; after T, a later event
    feed.cursor_pages["C10"] = CursorPage(
        events=[event(s20, "s20", position=20), event(s25, "s25", position=25)],
        next_cursor="T",
    )
    feed.cursor_pages["T"] = CursorPage(
        events=[event(later, "e40", position=40)], next_cursor="C40"
    )
    starter = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    assert (await starter.run_once()).result is PageResult.PROMOTED
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).applied_position == 40
    for _ in range(2 * AUDIT_EVERY):
        await starter.run_once()

    states = await receipt_states(engine, feed_name)
    assert states == {"e10": "applied", "s20": "applied", "s25": "applied", "e40": "applied"}
    backfills = {(a.kind, a.event_id): a.count for a in await feed_store.alarms.recent(feed_name)}
    assert backfills == {("backfill", "s20"): 1, ("backfill", "s25"): 1}
    passes = [cursor for cursor, limit in feed.asked if limit == MAX_PAGE]
    assert passes[0] == "C10" and "" not in passes  # its first mark: C10, never the token

    for _ in range(2 * AUDIT_EVERY):  # the first observer reads again too (from its start)
        await adopter.run_once()
        await starter.run_once()
    assert await receipt_states(engine, feed_name) == states
    assert {
        (a.kind, a.event_id): a.count for a in await feed_store.alarms.recent(feed_name)
    } == backfills
    for payout in (first, s20, s25, later):
        assert await feed_settlements(engine, payout.operation_id) == 1


@pytest.mark.parametrize("promoted_cursor", [None, "C10"], ids=["before-0013", "kept"])
async def test_an_observer_starts_its_passes_at_the_promoted_cursor_or_the_resume_cursor(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    promoted_cursor: str | None,
) -> None:
    """A row written before migration 0013 has no promoted cursor: its resume cursor stands
    in as the start of the observer's passes, as before; a row that has one starts them
    there."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", BOTH)
    await set_checkpoint(
        engine, feed_name, "cursor",
        resume_cursor="C30", applied_position=30, promoted_cursor=promoted_cursor,
    )  # fmt: skip
    feed = ScriptedFeed(spec)
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    page = await watcher.run_once()
    assert page.result is PageResult.CAUGHT_UP
    watcher.wait_after(page)  # idle: the next request also reads a page of the pass
    assert (await watcher.run_once()).result is PageResult.CAUGHT_UP
    passes = [cursor for cursor, limit in feed.asked if limit == MAX_PAGE]
    assert passes == ["C30" if promoted_cursor is None else "C10"]


async def test_an_observer_that_never_promotes_moves_its_passes_base_with_the_others(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """Two observers of a no-backfill feed; one always promotes first. The other remembers
    the promotions it reads on the checkpoint, so one audit window after the checkpoint was
    promoted to C30 its passes start there, not at C10 where it started (the purge takes
    the receipts behind a checkpoint of one retention ago: a base left behind would read
    events whose receipts are gone)."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    source = ScriptedFeed(spec)
    source.cursor_pages[""] = CursorPage(
        events=[event(first, "e10", position=10)], next_cursor="C10"
    )
    promoter = observer(spec, source, store, feed_store, engine, clock, audit_window=300)
    follower_feed = ScriptedFeed(spec)  # every page it asks for is empty: it never promotes
    follower = observer(spec, follower_feed, store, feed_store, engine, clock, audit_window=300)
    assert (await promoter.run_once()).result is PageResult.PROMOTED
    page = await follower.run_once()
    assert page.result is PageResult.CAUGHT_UP
    follower.wait_after(page)  # idle: each request also reads a page of its pass

    clock.advance(100)
    source.cursor_pages["C10"] = CursorPage(
        events=[event(second, "e30", position=30)], next_cursor="C30"
    )
    assert (await promoter.run_once()).result is PageResult.PROMOTED
    assert (await follower.run_once()).result is PageResult.CAUGHT_UP  # C30 is not old yet
    clock.advance(300)  # the promotion to C30 is one audit window old
    assert (await follower.run_once()).result is PageResult.CAUGHT_UP

    passes = [cursor for cursor, limit in follower_feed.asked if limit == MAX_PAGE]
    assert passes == ["C10", "C30"]
