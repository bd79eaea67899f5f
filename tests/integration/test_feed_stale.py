"""Stale concurrent observers on a timestamp feed, against real PostgreSQL: an observer that
read the checkpoint and its page before another moved the checkpoint twice writes no second
outcome and never moves the checkpoint back. Interleavings are forced with a failpoint that
waits (and PostgreSQL's own list of lock waiters), never with sleeps."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.observer import PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.failpoints import Failpoints
from service.store.feeds import FeedStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    ScriptedFeed,
    event,
    feed_settlements,
    observer,
    receipt_states,
    unknown_payout,
)
from tests.locks import lock_waiters

pytestmark = pytest.mark.integration

# Seconds a blocked observer is given to queue behind the other's uncommitted receipt.
QUEUE_WAIT = 10.0


class Gate(Failpoints):
    """Waits at the first hit of ``name`` until released (other hits pass)."""

    def __init__(self, name: str) -> None:
        super().__init__({})
        self.name = name
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def hit(self, name: str) -> None:
        if name == self.name and not self.reached.is_set():
            self.reached.set()
            await self.release.wait()


@pytest.fixture
async def holder(migrated_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(migrated_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        yield conn
    finally:
        await conn.close()


async def two_observers(
    engine: AsyncEngine,
    open_engine: Callable[[], AsyncEngine],
    store: SettlementStore,
    clock: Clock,
    pool: Any,
    principal_id: uuid.UUID,
    feed_name: str,
    gate: Gate,
) -> tuple[ScriptedFeed, Any, Any, list[Any], FeedStore]:
    """A timestamp feed serving e0@10, e1@10, e2@11 (each about an unknown payout), and
    two observers on their own connections: ``stale`` (waiting at ``gate``) and ``fresh``."""
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/timestamp", TIMESTAMP_PROMISES)
    ops = [await unknown_payout(store, principal_id, clock) for _ in range(4)]
    feed = ScriptedFeed(spec)
    feed.events = [
        event(op, f"e{n}", timestamp=t)
        for n, (op, t) in enumerate(zip(ops[:3], (10, 10, 11), strict=True))
    ]
    other_engine = open_engine()
    other_store = SettlementStore(other_engine, clock=clock, pool=pool)
    stale_feeds = FeedStore(engine, store.runner, settle=store.settle_phase_of)
    fresh_feeds = FeedStore(other_engine, other_store.runner, settle=other_store.settle_phase_of)
    stale = observer(spec, feed, store, stale_feeds, engine, clock, failpoints=gate)
    fresh = observer(spec, feed, other_store, fresh_feeds, other_engine, clock)
    return feed, stale, fresh, ops, fresh_feeds


async def test_a_stale_observer_at_the_barrier_never_moves_the_checkpoint_back(
    engine: AsyncEngine,
    open_engine: Callable[[], AsyncEngine],
    store: SettlementStore,
    clock: Clock,
    pool: Any,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """The stale observer settles its page and would close through 10 with the version it
    read; meanwhile the fresh one closes through 10, then 11. The stale CAS loses."""
    gate = Gate("observer.barrier.before")
    feed, stale, fresh, ops, feeds = await two_observers(
        engine, open_engine, store, clock, pool, principal_id, feed_name, gate
    )
    late = asyncio.create_task(stale.run_once())
    await asyncio.wait_for(gate.reached.wait(), QUEUE_WAIT)
    assert (await fresh.run_once()).result is PageResult.PROMOTED  # all settled: 10 closes
    assert (
        await feeds.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 10
    feed.events.append(event(ops[3], "e3", timestamp=12))
    assert (await fresh.run_once()).result is PageResult.PROMOTED
    moved = await feeds.checkpoints.checkpoint(feed_name, "timestamp")
    assert moved.closed_through_timestamp == 11

    gate.release.set()
    assert (await late).result is PageResult.LOST

    after = await feeds.checkpoints.checkpoint(feed_name, "timestamp")
    assert (after.closed_through_timestamp, after.version) == (11, moved.version)
    for op in ops:
        assert await feed_settlements(engine, op.operation_id) == 1
    assert set((await receipt_states(engine, feed_name)).values()) == {"applied"}


async def test_a_stale_observer_racing_for_the_same_receipts_writes_each_outcome_once(
    engine: AsyncEngine,
    open_engine: Callable[[], AsyncEngine],
    store: SettlementStore,
    clock: Clock,
    pool: Any,
    principal_id: uuid.UUID,
    feed_name: str,
    holder: asyncpg.Connection,
) -> None:
    """The stale observer is about to commit the first receipt of its page; the fresh one
    asks the same page and queues behind that uncommitted receipt. Released, both go on
    through the same three events: one outcome each, and one checkpoint move."""
    gate = Gate("observer.event.before_commit")
    feed, stale, fresh, ops, feeds = await two_observers(
        engine, open_engine, store, clock, pool, principal_id, feed_name, gate
    )
    before = await feeds.checkpoints.checkpoint(feed_name, "timestamp")
    late = asyncio.create_task(stale.run_once())
    await asyncio.wait_for(gate.reached.wait(), QUEUE_WAIT)
    racing = asyncio.create_task(fresh.run_once())
    await lock_waiters(holder, 1, patience=QUEUE_WAIT)

    gate.release.set()
    results = {(await late).result, (await racing).result}

    # one of them closes through 10; the other finds it closed (lost) or nothing left
    assert PageResult.PROMOTED in results or PageResult.CAUGHT_UP in results
    after = await feeds.checkpoints.checkpoint(feed_name, "timestamp")
    assert after.closed_through_timestamp == 10
    assert after.version == before.version + 1
    for op in ops[:3]:
        assert await feed_settlements(engine, op.operation_id) == 1
    assert await receipt_states(engine, feed_name) == {
        "e0": "applied",
        "e1": "applied",
        "e2": "applied",
    }
    assert feed.asked  # both asked the feed
