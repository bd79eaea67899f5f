"""The walks behind a feed's checkpoint (service/app/feed_walks.py) on either feed kind: a
walk page whose event is left without an outcome is read again. Real PostgreSQL, scripted
feeds."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.observer import MAX_PAGE, PageResult
from service.config import FeedSpec
from service.domain.feeds import CursorPage
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
    checkpoint = await feed_store.checkpoint(name, kind)
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
