"""Retention of the feeds' own rows against real PostgreSQL (service/store/retention.py,
service/app/purger.py): final receipts out of every page's reach and alarms not raised
again go after ``feed_rows``; holds, receipts a page may still serve (on a no-backfill
cursor feed: those its checkpoint passed less than ``feed_rows`` ago), and every receipt of
a cursor feed that may backfill stay; observations written about an expired operation go
with its tombstone, and those about an operation that was never here after ``orphans``."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import TextClause

from service.app.observer import AUDIT_EVERY, MAX_PAGE, PageResult
from service.app.purger import Purger, feed_reach
from service.config import FeedSpec
from service.domain.feeds import CursorPage
from service.store.feed_tables import feed_alarms, feed_promotions, feed_receipts
from service.store.feeds import FeedStore
from service.store.retention import (  # a purge statement, for its plan
    _FORGET_ORPHANS,
    Retention,
    RetentionStore,
)
from service.store.rows import at
from service.store.settlement import SettlementStore
from service.store.tables import observations, tombstones
from service.telemetry import Metrics
from tests.integration.factories import Clock, new_operation
from tests.integration.test_feed_observer import (
    ScriptedFeed,
    event,
    foreign,
    observer,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)

pytestmark = pytest.mark.integration

DAY = 86_400.0
KEEP = 30 * DAY  # feed_rows
WINDOW = 300  # the timestamp feed's audit window


def retention(**reach: int) -> Retention:
    return Retention(default=60.0, tombstone=600.0, feed_rows=KEEP, feed_reach=reach)


def purger(engine: AsyncEngine, clock: Clock, policy: Retention, batch: int = 500) -> Purger:
    store = RetentionStore(engine, policy)
    return Purger(store, Metrics(), interval=1.0, clock=clock, batch=batch)


async def receipt(
    engine: AsyncEngine, feed: str, event_id: str, order: int, state: str, age: float, clock: Clock
) -> None:
    """A receipt decided ``age`` seconds before the clock's now."""
    decided = at(clock() - age)
    async with engine.begin() as conn:
        await conn.execute(
            feed_receipts.insert().values(
                feed=feed,
                event_id=event_id,
                event_order=order,
                state=state,
                reason="test",
                first_seen_at=decided,
                decided_at=decided,
            )
        )


async def promoted(engine: AsyncEngine, feed: str, position: int, age: float, clock: Clock) -> None:
    """The feed's checkpoint was promoted to ``position`` ``age`` seconds before now."""
    async with engine.begin() as conn:
        await conn.execute(
            feed_promotions.insert().values(
                feed=feed, applied_position=position, promoted_at=at(clock() - age)
            )
        )


async def promotions(engine: AsyncEngine, feed: str) -> list[int]:
    async with engine.connect() as conn:
        found = await conn.execute(
            select(feed_promotions.c.applied_position)
            .where(feed_promotions.c.feed == feed)
            .order_by(feed_promotions.c.applied_position)
        )
        return [row.applied_position for row in found]


async def kept(engine: AsyncEngine, feed: str) -> set[str]:
    async with engine.connect() as conn:
        found = await conn.execute(
            select(feed_receipts.c.event_id).where(feed_receipts.c.feed == feed)
        )
        return {row.event_id for row in found}


async def test_a_timestamp_feeds_receipts_go_once_behind_its_audit_window_and_old(
    engine: AsyncEngine, clock: Clock, feed_name: str
) -> None:
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=10_000)
    old = KEEP + 1
    await receipt(engine, feed_name, "gone", 10_000 - WINDOW - 1, "applied", old, clock)
    await receipt(engine, feed_name, "quarantined", 5, "quarantined", old, clock)
    await receipt(engine, feed_name, "audited", 10_000 - WINDOW, "applied", old, clock)
    await receipt(engine, feed_name, "recent", 10, "ignored", KEEP - 60, clock)
    await receipt(engine, feed_name, "held", 1, "held", old, clock)

    done = await purger(engine, clock, retention(**{feed_name: WINDOW})).run_once()

    assert done.feed_rows >= 2  # and any old alarm other tests left
    # the audit still reads "audited"; "recent" is young; a hold is never purged
    assert await kept(engine, feed_name) == {"audited", "recent", "held"}


@pytest.mark.parametrize("no_backfill", [True, False])
async def test_a_cursor_feeds_receipts_go_behind_its_checkpoint_only_if_it_never_backfills(
    engine: AsyncEngine, clock: Clock, feed_name: str, no_backfill: bool
) -> None:
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C", applied_position=50)
    await promoted(engine, feed_name, 50, KEEP + 1, clock)
    old = KEEP + 1
    await receipt(engine, feed_name, "behind", 40, "applied", old, clock)
    await receipt(engine, feed_name, "at", 50, "quarantined", old, clock)
    await receipt(engine, feed_name, "ahead", 60, "applied", old, clock)  # a page may hold it
    spec = FeedSpec(
        feed_name, "cursor", "http://f.invalid/c", frozenset({"no-backfill"} if no_backfill else ())
    )
    reach = feed_reach([spec], WINDOW)

    await purger(engine, clock, retention(**reach)).run_once()

    # a feed that may backfill is read again from its start: every receipt is in reach
    expected = {"ahead"} if no_backfill else {"behind", "at", "ahead"}
    assert await kept(engine, feed_name) == expected


async def test_a_no_backfill_feeds_receipts_go_once_its_checkpoint_passed_them_a_retention_ago(
    engine: AsyncEngine, clock: Clock, feed_store: FeedStore, feed_name: str
) -> None:
    """A receipt decided long ago that the checkpoint passed only lately (a jump after a
    hold) stays until the promotion that passed it is older than the retention; then it
    goes, and so do the promotions behind the newest one that old."""
    spec = FeedSpec(feed_name, "cursor", "http://f.invalid/c", frozenset({"no-backfill"}))
    policy = retention(**feed_reach([spec], WINDOW))
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C10", applied_position=10)
    await promoted(engine, feed_name, 10, KEEP + DAY, clock)
    old = 2 * KEEP
    await receipt(engine, feed_name, "passed-long-ago", 10, "applied", old, clock)
    await receipt(engine, feed_name, "passed-lately", 40, "applied", old, clock)
    await receipt(engine, feed_name, "ahead", 60, "applied", old, clock)
    current = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert await feed_store.checkpoints.promote_cursor(current, "C50", 50, at(clock()))  # the jump
    assert not await feed_store.checkpoints.promote_cursor(
        current, "C90", 90, at(clock())
    )  # lost: no note

    await purger(engine, clock, policy).run_once()

    assert await kept(engine, feed_name) == {"passed-lately", "ahead"}
    assert await promotions(engine, feed_name) == [10, 50]
    clock.advance(KEEP - 1)
    again = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    # an overlap page promotes to a new cursor at the same position: passed when first noted
    assert await feed_store.checkpoints.promote_cursor(again, "C50b", 50, at(clock()))
    await purger(engine, clock, policy).run_once()
    assert await kept(engine, feed_name) == {"passed-lately", "ahead"}

    clock.advance(1)
    await purger(engine, clock, policy).run_once()

    assert await kept(engine, feed_name) == {"ahead"}
    assert await promotions(engine, feed_name) == [50]


async def test_a_checkpoint_jumping_after_a_long_hold_leaves_the_next_pass_its_receipts(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """A hold keeps a no-backfill cursor feed's checkpoint behind a decided receipt for
    longer than the retention; the checkpoint jumps over it; a purge runs; the next
    reconciliation pass (from the checkpoint of one audit window ago) still reads it and
    finds its receipt: no false backfill alarm. Once the jump is older than the retention,
    the pass reads after it and the receipts go."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    policy = retention(**feed_reach([spec], WINDOW))
    payout, later = await unknown_payout(store, principal_id, clock), str(uuid.uuid4())
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(
        events=[foreign("h5", later, position=5), event(payout, "e10", position=10)],
        next_cursor="C10",
    )
    # an event about an operation not here yet is held (for longer than the retention)
    watcher = observer(spec, feed, store, feed_store, engine, clock, audit_window=WINDOW)
    assert (await watcher.run_once()).result is PageResult.BLOCKED
    assert await receipt_states(engine, feed_name) == {"h5": "held", "e10": "applied"}
    clock.advance(KEEP + DAY)
    await unknown_payout(store, principal_id, clock, new_operation_id=later)
    assert (await watcher.run_once()).result is PageResult.PROMOTED  # h5 settled: the jump

    await purger(engine, clock, policy).run_once()
    for _ in range(AUDIT_EVERY):
        await watcher.run_once()

    assert ("", MAX_PAGE) in feed.asked  # the pass read the jumped-over receipts again
    assert not [a for a in await feed_store.alarms.recent(feed_name) if a.kind == "backfill"]
    assert await receipt_states(engine, feed_name) == {"h5": "applied", "e10": "applied"}

    clock.advance(KEEP + 1)
    asked = len(feed.asked)
    await purger(engine, clock, policy).run_once()
    for _ in range(2 * AUDIT_EVERY):
        await watcher.run_once()

    assert ("", MAX_PAGE) not in feed.asked[asked:]  # the pass reads after the jump now
    assert await receipt_states(engine, feed_name) == {}
    assert not [a for a in await feed_store.alarms.recent(feed_name) if a.kind == "backfill"]


async def test_receipts_of_a_feed_this_process_does_not_observe_stay(
    engine: AsyncEngine, clock: Clock, feed_name: str
) -> None:
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=10_000)
    await receipt(engine, feed_name, "old", 1, "applied", KEEP + 1, clock)

    await purger(engine, clock, retention(other=WINDOW)).run_once()

    assert await kept(engine, feed_name) == {"old"}


async def test_feed_purges_run_in_bounded_batches(
    engine: AsyncEngine, clock: Clock, feed_name: str
) -> None:
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=10_000)
    for n in range(7):
        await receipt(engine, feed_name, f"e{n}", n, "applied", KEEP + 1, clock)
    store = RetentionStore(engine, retention(**{feed_name: WINDOW}))

    first = await store.forget_feed_rows(3, at(clock()))

    assert first.full  # a batch of 3 receipts (and of any old alarms other tests left)
    assert len(await kept(engine, feed_name)) == 4
    await purger(engine, clock, retention(**{feed_name: WINDOW}), batch=3).run_once()
    assert not await kept(engine, feed_name)


async def test_alarms_go_once_they_have_not_been_raised_again_for_the_retention(
    engine: AsyncEngine, clock: Clock, feed_name: str
) -> None:
    async with engine.begin() as conn:
        for event_id, age in (("stale", KEEP + 1), ("raised-lately", KEEP - 60)):
            when = at(clock() - age)
            await conn.execute(
                feed_alarms.insert().values(
                    feed=feed_name,
                    kind="late-event",
                    event_id=event_id,
                    detail="test",
                    first_at=at(clock() - 2 * KEEP),
                    last_at=when,
                )
            )

    await purger(engine, clock, retention()).run_once()

    async with engine.connect() as conn:
        left = await conn.execute(
            select(feed_alarms.c.event_id).where(feed_alarms.c.feed == feed_name)
        )
        assert {row.event_id for row in left} == {"raised-lately"}


async def test_observations_of_an_expired_operation_go_with_its_tombstone(
    engine: AsyncEngine, clock: Clock, principal_id: uuid.UUID
) -> None:
    """A feed event for an operation already purged is quarantined operation-expired and
    recorded as an observation; when the tombstone is forgotten, so is it. Another
    operation's observations stay."""
    expired, other = uuid.uuid4(), uuid.uuid4()
    async with engine.begin() as conn:
        await conn.execute(
            tombstones.insert().values(
                tenant="acme",
                principal_id=principal_id,
                route="POST /v1/payouts",
                idempotency_key=uuid.uuid4().hex,
                operation_id=expired,
                request_fingerprint="0" * 64,
                final_state="completed",
                expired_at=at(clock() - 700),
                forget_at=at(clock() - 1),
            )
        )
        for operation_id in (expired, expired, other):
            await conn.execute(observations.insert().values(**_quarantined(operation_id)))

    done = await purger(engine, clock, retention()).run_once()

    assert done.tombstones >= 1
    async with engine.connect() as conn:
        left = await conn.execute(
            select(observations.c.operation_id).where(
                observations.c.operation_id.in_([expired, other])
            )
        )
        assert [row.operation_id for row in left] == [other]


async def test_observations_about_an_operation_never_here_go_after_their_retention(
    engine: AsyncEngine, clock: Clock, store: SettlementStore
) -> None:
    """An ``unknown-operation`` observation older than ``orphans`` goes, through its partial
    index and in bounded batches; a younger one stays, and so does an old one whose
    operation is here after all (it goes with that operation) and an old one of another
    reason (an expired operation's: it goes with the tombstone)."""
    _, here = await new_operation(engine, store, clock)
    never, young, expired = (uuid.uuid4() for _ in range(3))
    old, recent = at(clock() - KEEP - 1), at(clock() - KEEP + 60)
    async with engine.begin() as conn:
        rows = [(never, old)] * 3 + [(young, recent), (here, old)]
        for operation_id, created in rows:
            values = {**_quarantined(operation_id), "reason": "unknown-operation"}
            await conn.execute(observations.insert().values(**values, created_at=created))
        values = {**_quarantined(expired), "created_at": old}
        await conn.execute(observations.insert().values(**values))
        found = await plan(conn, _FORGET_ORPHANS, {"cutoff": at(clock()), "batch": 2})
    assert "ix_observations_unknown_operation_created_at" in found

    first = await RetentionStore(engine, retention()).forget_orphans(2, at(clock()))
    assert (first.purged, first.full) == (2, True)
    done = await purger(engine, clock, retention()).run_once()

    assert done.orphans >= 1  # the third; others of the database's earlier tests may go too
    async with engine.connect() as conn:
        left = await conn.execute(
            select(observations.c.operation_id).where(
                observations.c.operation_id.in_([never, young, here, expired])
            )
        )
        assert sorted(str(row.operation_id) for row in left) == sorted(
            str(kept) for kept in (young, here, expired)
        )


async def plan(conn: AsyncConnection, statement: TextClause, params: dict[str, Any]) -> str:
    """PostgreSQL's plan of ``statement`` with scans of whole tables switched off for the
    transaction: the tables hold a few rows here, where such a scan is the cheaper plan, so
    this shows which index the statement can read through, not what a large table gets."""
    await conn.execute(text("SET LOCAL enable_seqscan = off"))
    rows = await conn.execute(text("EXPLAIN " + statement.text), params)
    return "\n".join(row[0] for row in rows)


def _quarantined(operation_id: uuid.UUID) -> dict[str, Any]:
    """A feed's observation quarantined as the server writes it, with its tenant (the
    operation's, the tombstone's or the observer's: here all ``acme``)."""
    return {
        "tenant": "acme",
        "operation_id": operation_id,
        "source": "feed",
        "kind": "completed",
        "verified": True,
        "stage": "A",
        "disposition": "quarantined",
        "reason": "operation-expired",
    }
