"""The feed observer at the edges of what a source does: empty pages with a fresh token each
time, and the same event id served twice in one page with different content. Real
PostgreSQL, scripted feeds."""

from __future__ import annotations

import contextlib
import uuid

import msgspec
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_walks import WALK_FAILURES
from service.app.observer import AUDIT_EVERY, MAX_PAGE, PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.domain.feeds import CursorPage, FeedUnavailable, TimestampPage
from service.failpoints import FailpointError
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


class FreshTokens(ScriptedFeed):
    """A source that answers every request with an empty page and a token never seen."""

    async def cursor_page(self, cursor: str, limit: int) -> CursorPage:
        self.asked.append((cursor, limit))
        return CursorPage(events=[], next_cursor=f"T{len(self.asked)}")


@pytest.mark.parametrize("documented", [True, False])
async def test_empty_pages_with_a_fresh_token_each_back_off_and_never_climb_the_version(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    documented: bool,
) -> None:
    """Documented (``empty-advance``), the newest token is kept; otherwise none is adopted
    and the request's cursor is asked again. Either way: a backoff, and no new version."""
    promises = frozenset({"no-backfill"} | ({"empty-advance"} if documented else set()))
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", promises)
    feed = FreshTokens(spec)
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    before = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    waits = []
    for _ in range(200):
        page = await watcher.run_once()
        assert page.result is PageResult.CAUGHT_UP
        waits.append(watcher.wait_after(page))
    # backs off like a caught-up feed (1 s doubled up to the 8 s bound), never a 0 s loop
    assert waits[:5] == [1.0, 2.0, 4.0, 8.0, 8.0] and min(waits) > 0
    after = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert after.version == before.version  # nothing was passed: no new version
    assert after.resume_cursor == ("T200" if documented else "")
    assert after.caught_up_at is not None
    assert len(feed.asked) == 200
    asked = {cursor for cursor, _ in feed.asked}
    assert asked == ({""} | {f"T{n}" for n in range(1, 200)} if documented else {""})


class Served(ScriptedFeed):
    """A timestamp source serving one fixed page."""

    def __init__(self, spec: FeedSpec, page: TimestampPage) -> None:
        super().__init__(spec)
        self.page = page

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        self.asked.append((after, limit))
        return self.page


@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
async def test_one_event_id_twice_in_a_page_with_other_content_stops_the_page(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    kind: str,
) -> None:
    """The same event id at two places of one page, each with its own evidence: a
    conflicting identity, alarmed, and nothing is settled or passed."""
    spec = FeedSpec(feed_name, kind, f"http://feed.invalid/{kind}", promised(kind))
    a, b = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    if kind == "cursor":
        feed = ScriptedFeed(spec)
        feed.cursor_pages[""] = CursorPage(
            events=[event(a, "dup", position=1), event(b, "dup", position=2)], next_cursor="N"
        )
    else:
        feed = Served(
            spec,
            TimestampPage(
                events=[event(a, "dup", timestamp=10), event(b, "dup", timestamp=10)],
                finality_watermark=20,
            ),
        )
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert await receipt_states(engine, feed_name) == {}
    assert {x.kind for x in await feed_store.alarms.recent(feed_name)} == {"conflicting-identity"}
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, kind)
    assert (checkpoint.resume_cursor, checkpoint.closed_through_timestamp) == ("", None)


class InclusiveAfter(ScriptedFeed):
    """A timestamp source whose ``after`` is inclusive: it serves the closed timestamp's
    events again on every page."""

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        self.asked.append((after, limit))
        later = [e for e in self.events if after is None or (e.timestamp or 0) >= after]
        return TimestampPage(events=later[:limit], finality_watermark=self.watermark)


async def test_an_inclusive_after_and_a_tie_group_larger_than_the_page_grow_the_page(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """Consecutive timestamps 100 (3 events) and 101 (12 events), pages of 10, ``after``
    inclusive: once 100 is closed, every page is 100's three again plus seven of 101. Only
    the events after the closed timestamp say one tie group fills the page: the page grows
    and 101 closes (it used to answer caught-up forever)."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    feed = InclusiveAfter(spec)
    feed.events = [foreign(f"a{n}", timestamp=100) for n in range(3)]
    feed.events += [foreign(f"b{n}", timestamp=101) for n in range(12)]
    feed.events += [foreign("c", timestamp=102)]
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    results = [(await watcher.run_once()).result for _ in range(6)]
    assert PageResult.GROW in results
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    assert checkpoint.closed_through_timestamp == 101
    states = await receipt_states(engine, feed_name)
    assert len(states) == 16 and set(states.values()) == {"quarantined"}


async def test_a_hold_behind_the_checkpoint_served_again_blocks_nothing_ahead_of_it(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """An inclusive ``after`` serves, at the closed timestamp, an event held for an operator
    (its signature does not verify): the hold stays, listed and decided on its own, and the
    events after the closed timestamp close as usual."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=100)
    feed = InclusiveAfter(spec)
    forged = foreign("x", timestamp=100)
    feed.events = [
        msgspec.structs.replace(forged, signature="0" * 64),
        foreign("y", timestamp=101),
        foreign("z", timestamp=102),
    ]
    feed.watermark = 105
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    for _ in range(3):
        await watcher.run_once()
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 105
    states = await receipt_states(engine, feed_name)
    assert states == {"x": "held", "y": "quarantined", "z": "quarantined"}


async def test_the_audit_pages_through_its_window_on_a_feed_that_never_goes_idle(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """600 settled events in the audit window (timestamps 1000-1599), then one event arrives
    late at the closed timestamp while new events keep coming on every page: the audit,
    paging through its window (pages of 500) a page every AUDIT_EVERY requests, finds it,
    alarms and gives it a receipt, though the feed is never idle."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    feed = ScriptedFeed(spec)
    feed.events = [foreign(f"e{n}", timestamp=1000 + n) for n in range(600)]
    feed.watermark = 1599
    watcher = observer(
        spec, feed, store, feed_store, engine, clock, grace=0.0, page_size=100,
        audit_window=1000,
    )  # fmt: skip
    for _ in range(7):
        await watcher.run_once()
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 1599
    late = foreign("late", timestamp=1599)
    feed.events.insert(600, late)  # behind the closed timestamp: no main page asks there
    for n in range(4 * AUDIT_EVERY):
        stamp = 1600 + n
        feed.events.append(foreign(f"new{n}", timestamp=stamp))  # busy: never an empty page
        feed.watermark = stamp
        page = await watcher.run_once()
        assert page.events > 0
    states = await receipt_states(engine, feed_name)
    assert states.get("late") == "quarantined"  # its operation is not here (grace 0)
    assert {
        a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"
    } == {"late"}


FAILPOINTS = [
    "observer.event.before_commit",
    "observer.event.after_commit",
    "observer.quarantine.before",
    "observer.quarantine.after",
    "observer.barrier.before",
    "observer.barrier.after",
]


@pytest.mark.parametrize("failpoint", FAILPOINTS)
@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
async def test_a_crash_at_any_failpoint_of_either_feed_kind_resumes_with_one_outcome_each(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    kind: str,
    failpoint: str,
) -> None:
    """Both feed kinds, every failpoint: the observer dies there (its first hit), a new one
    takes over the same feed; every event ends with one final receipt, each payout is
    settled once by the feed, and the checkpoint passes them all."""
    spec = FeedSpec(feed_name, kind, f"http://feed.invalid/{kind}", promised(kind))
    ops = [await unknown_payout(store, principal_id, clock) for _ in range(3)]
    order = "position" if kind == "cursor" else "timestamp"
    served = [
        event(ops[0], "e0", **{order: 10}),
        foreign("stranger", **{order: 11}),  # its operation is not here: quarantined
        event(ops[1], "e1", **{order: 12}),
        event(ops[2], "e2", **{order: 13}),
    ]
    feed = ScriptedFeed(spec)
    if kind == "cursor":
        feed.cursor_pages[""] = CursorPage(events=served[:2], next_cursor="P2")
        feed.cursor_pages["P2"] = CursorPage(events=served[2:], next_cursor="P4")
    else:
        feed.events = served
        feed.watermark = 100
    crash = CountingFailpoints(failpoint, nth=1)
    doomed = observer(
        spec, feed, store, feed_store, engine, clock, grace=0.0, page_size=2, failpoints=crash
    )
    for _ in range(4):  # the failpoint strikes on one of these pages; the observer is gone
        with contextlib.suppress(FailpointError):  # an event's is caught by its page
            await doomed.run_once()
        if crash.hits:
            break
    else:
        pytest.fail(f"{failpoint} was never reached")
    resumed = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, page_size=2)
    for _ in range(6):
        await resumed.run_once()
    states = await receipt_states(engine, feed_name)
    assert states == {"e0": "applied", "stranger": "quarantined", "e1": "applied", "e2": "applied"}
    for op in ops:
        assert await feed_settlements(engine, op.operation_id) == 1
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, kind)
    if kind == "cursor":
        assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("P4", 13)
    else:
        assert checkpoint.closed_through_timestamp == 100


class Capped(ScriptedFeed):
    """A timestamp source that silently serves at most ``cap`` events a page, whatever the
    limit asked, and may claim a watermark ahead of what it has served."""

    def __init__(self, spec: FeedSpec, cap: int) -> None:
        super().__init__(spec)
        self.cap = cap

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        self.asked.append((after, limit))
        later = [e for e in self.events if after is None or (e.timestamp or 0) > after]
        return TimestampPage(events=later[: min(limit, self.cap)], finality_watermark=5000)


@pytest.mark.parametrize(
    ("promises", "skips"),
    [
        (frozenset({"later-timestamp", "watermark"}), False),  # what this source keeps
        (TIMESTAMP_PROMISES, True),  # it breaks short-page-end: caught by the audit
    ],
    ids=["configured-honestly", "trusting-a-broken-promise"],
)
async def test_a_silent_page_cap_skips_nothing_unless_a_broken_promise_is_trusted(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    promises: frozenset[str],
    skips: bool,
) -> None:
    """The issue's case: a cap of 50 under a limit of 100 and a watermark of 5000, events
    at 1001-1100. Configured honestly (no short-page-end), a short page proves nothing past
    its last timestamp: every event gets a receipt. Configured to trust short-page-end, the
    observer closes through 5000 over events it never saw, and the audit, walking the window
    behind the closed timestamp, alarms (late-event) and gives them receipts: never a silent
    skip."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", promises)
    feed = Capped(spec, cap=50)
    feed.events = [foreign(f"e{n}", timestamp=n) for n in range(1001, 1101)]
    watcher = observer(
        spec, feed, store, feed_store, engine, clock, grace=0.0, page_size=100,
        audit_window=10_000,
    )  # fmt: skip
    for _ in range(5):
        await watcher.run_once()
    states = await receipt_states(engine, feed_name)
    closed = (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp
    late = {a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"}
    if not skips:
        assert len(states) == 100 and not late
        # a short page may be capped: its last timestamp stays open until a later event
        # proves it (the watermark proves only up to the page's last timestamp - 1)
        assert closed == 1099
        return
    assert closed == 5000 and len(states) == 50 and not late  # 1051-1100 passed unseen...
    for _ in range(4 * AUDIT_EVERY):  # the audit's walk: capped pages of 50, one per ten
        await watcher.run_once()
    states = await receipt_states(engine, feed_name)
    late = {a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"}
    assert len(states) == 100  # ...until the audit found them, each alarmed
    assert late == {f"e{n}" for n in range(1051, 1101)}
    assert not [a for a in await feed_store.alarms.recent(feed_name) if a.kind == "tie-stall"]


@pytest.mark.parametrize(
    ("promises", "early"),
    [(frozenset({"later-timestamp"}), False), (TIMESTAMP_PROMISES, True)],
    ids=["configured-honestly", "trusting-a-broken-promise"],
)
async def test_a_watermark_that_lies_is_caught_by_the_audit_when_it_is_trusted(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    promises: frozenset[str],
    early: bool,
) -> None:
    """A source whose watermark runs 100 s ahead of the truth: an event arrives at 1050
    after a watermark of 1100 was served. Not trusting the watermark, the observer closes
    only what later events prove, so the event is read on a main page; trusting it, the
    feed closed through 1100 first, and the audit alarms the late event and settles it."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", promises)
    feed = ScriptedFeed(spec)
    feed.events = [foreign(f"e{n}", timestamp=n) for n in (1000, 1010)]
    feed.watermark = 1100  # a lie: events up to 1100 may still come
    watcher = observer(
        spec, feed, store, feed_store, engine, clock, grace=0.0, page_size=10,
        audit_window=10_000,
    )  # fmt: skip
    for _ in range(3):
        await watcher.run_once()
    closed = (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp
    assert closed == (1100 if early else 1009)
    feed.events.append(foreign("late", timestamp=1050))
    feed.events.append(foreign("after", timestamp=1200))
    for _ in range(2 * AUDIT_EVERY):
        await watcher.run_once()
    states = await receipt_states(engine, feed_name)
    assert states.get("late") == "quarantined"  # a receipt either way, never skipped
    late = {a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "late-event"}
    assert late == ({"late"} if early else set())


@pytest.mark.parametrize(
    "promises",
    [frozenset(), frozenset({"no-backfill"})],
    ids=["may-backfill", "promises-no-backfill"],
)
async def test_a_cursor_feed_is_read_again_and_a_backfill_is_found(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    promises: frozenset[str],
) -> None:
    """An event added behind the cursor after its page was served, with no overlap page to
    show it: the feed is read again, paced (one page in AUDIT_EVERY requests), and the
    backfill gets an alarm and a receipt. A feed that promises no-backfill is checked too
    (here from its start: the observer has run for less than one audit window)."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", promises)
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(
        events=[event(first, "e10", position=10), event(second, "e30", position=30)],
        next_cursor="C30",
    )
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    # backfilled at 20, behind the served cursor: the main pages (from C30) never show it
    feed.cursor_pages[""] = CursorPage(
        events=[
            event(first, "e10", position=10),
            foreign("b20", position=20),
            event(second, "e30", position=30),
        ],
        next_cursor="C30",
    )
    for _ in range(2 * AUDIT_EVERY):
        await watcher.run_once()
    states = await receipt_states(engine, feed_name)
    alarms = {a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "backfill"}
    assert states.get("b20") == "quarantined" and alarms == {"b20"}
    assert states["e10"] == states["e30"] == "applied"


async def test_a_no_backfill_feed_is_read_again_only_back_one_audit_window(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """The promise is checked from the checkpoint of one audit window ago: a backfill
    behind that checkpoint is out of the pass's reach (as a late event is out of a
    timestamp audit's), one after it is found."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(first, "e10", position=10)], next_cursor="C10")
    feed.cursor_pages["C10"] = CursorPage(events=[], next_cursor="C10")
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0, audit_window=300)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    clock.advance(400)
    feed.cursor_pages["C10"] = CursorPage(
        events=[event(second, "e30", position=30)], next_cursor="C30"
    )
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    # two backfills: at 5 (behind C10, the checkpoint of a window ago) and at 20
    feed.cursor_pages[""] = CursorPage(
        events=[foreign("b5", position=5), event(first, "e10", position=10)], next_cursor="C10"
    )
    feed.cursor_pages["C10"] = CursorPage(
        events=[foreign("b20", position=20), event(second, "e30", position=30)],
        next_cursor="C30",
    )
    for _ in range(2 * AUDIT_EVERY):
        await watcher.run_once()
    states = await receipt_states(engine, feed_name)
    alarms = {a.event_id for a in await feed_store.alarms.recent(feed_name) if a.kind == "backfill"}
    assert states.get("b20") == "quarantined" and alarms == {"b20"}
    assert "b5" not in states
    assert [cursor for cursor, _ in feed.asked].count("") == 1  # the start is not read again


async def test_a_reconciliation_pass_goes_on_where_it_was_after_a_restart(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """Where the pass reads next is kept on the checkpoint's row: an observer started anew
    goes on from there instead of the feed's start (one restarted more often than a pass
    takes would otherwise never reach the far end of a long feed)."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    first, second = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C30", applied_position=30)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(first, "e10", position=10)], next_cursor="R1")
    feed.cursor_pages["R1"] = CursorPage(events=[foreign("b20", position=20)], next_cursor="R2")
    feed.cursor_pages["R2"] = CursorPage(
        events=[event(second, "e30", position=30)], next_cursor="C30"
    )
    before = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    for _ in range(AUDIT_EVERY):
        await before.run_once()
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).walk_cursor == "R1"

    after = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)  # a restart
    for _ in range(AUDIT_EVERY):
        await after.run_once()

    assert [cursor for cursor, limit in feed.asked if limit == MAX_PAGE] == ["", "R1"]
    assert (await receipt_states(engine, feed_name)).get("b20") == "quarantined"
    # both found behind the applied position without a receipt (e10 on the first page)
    assert {a.event_id for a in await feed_store.alarms.recent(feed_name)} == {"e10", "b20"}
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).walk_cursor == "R2"


async def test_an_idle_feed_reads_a_page_of_its_walk_with_every_request(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """Busy, one request in AUDIT_EVERY also reads a page of the walk; idle (the last page
    made no progress), every request does, so a walk over a long feed ends in bounded time."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C30", applied_position=30)
    feed = ScriptedFeed(spec)
    for n in range(5):
        feed.cursor_pages[f"R{n}" if n else ""] = CursorPage(
            events=[foreign(f"x{n}", position=n + 1)], next_cursor=f"R{n + 1}"
        )
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    for _ in range(4):
        watcher.wait_after(await watcher.run_once())  # C30 answers C30: caught up, idle
    walked = [cursor for cursor, limit in feed.asked if limit == MAX_PAGE]
    assert walked == ["", "R1", "R2"]  # from the second request on: every one


class WalkRefused(ScriptedFeed):
    """A source that gives the main pages but refuses every page of a walk (500 events)."""

    async def cursor_page(self, cursor: str, limit: int) -> CursorPage:
        if limit == MAX_PAGE:
            self.asked.append((cursor, limit))
            raise FeedUnavailable("feed: HTTP 400")
        return await super().cursor_page(cursor, limit)


async def test_a_walk_the_source_refuses_never_stops_the_feed_and_starts_anew(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """Every walk page fails (a kept cursor the source no longer takes, say): the main pages
    are read and promoted all the same, and after WALK_FAILURES in a row the walk's kept
    place is dropped, to start anew."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    paid = [await unknown_payout(store, principal_id, clock) for _ in range(3)]
    await set_checkpoint(
        engine, feed_name, "cursor", resume_cursor="C0", applied_position=0, walk_cursor="OLD"
    )
    feed = WalkRefused(spec)
    for n, op in enumerate(paid):
        feed.cursor_pages[f"C{n}"] = CursorPage(
            events=[event(op, f"e{n}", position=n + 1)], next_cursor=f"C{n + 1}"
        )
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    results = []
    for _ in range(7):
        page = await watcher.run_once()
        results.append(page.result)
        watcher.wait_after(page)
    assert results[:3] == [PageResult.PROMOTED] * 3  # busy: no walk page yet
    # caught up, then idle: a walk page with each request from the fifth on, refused
    assert set(results[3:]) == {PageResult.CAUGHT_UP}
    assert [cursor for cursor, _ in feed.asked if _ == MAX_PAGE] == ["OLD"] * WALK_FAILURES
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.walk_cursor) == ("C3", None)
