"""The feed observer (service/app/observer.py) against real PostgreSQL, with a scripted feed:
the three worked examples of the issue, holds, the grace period, contract breaks, and two
observers on one feed."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.observer import FeedObserver, PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.core import Claim, ObservationKind, OperationState, Source
from service.domain.feeds import CursorPage, FeedClient, RawEvent, TimestampPage
from service.evidence import (
    Evidence,
    EvidenceResult,
    canonical,
    content_type_for,
    result_digest,
    sign,
)
from service.failpoints import FailpointError, Failpoints
from service.store.feed_tables import feed_checkpoints, feed_receipts
from service.store.feeds import FeedStore
from service.store.retention import Retention, RetentionStore
from service.store.settlement import SettlementStore
from service.store.tables import observations
from tests.integration.factories import Clock, claim_request, make_scope
from tests.unit.factories import make_observation

pytestmark = pytest.mark.integration

SECRET = "feed-test-secret"


def promised(kind: str) -> frozenset[str]:
    """A scripted feed keeps every promise its kind may make (a test that breaks one says so)."""
    return TIMESTAMP_PROMISES if kind == "timestamp" else frozenset()


PAYOUTS = "POST /v1/payouts"


class ScriptedFeed(FeedClient):
    """The provider's feed, as a script: pages by cursor / by ``after``, and a log of asks."""

    def __init__(self, spec: FeedSpec) -> None:
        super().__init__(spec, timeout=1.0)
        self.cursor_pages: dict[str, CursorPage] = {}
        self.events: list[RawEvent] = []  # the timestamp feed's events, in order
        self.watermark: int | None = None
        self.asked: list[tuple[Any, int]] = []

    async def cursor_page(self, cursor: str, limit: int) -> CursorPage:
        self.asked.append((cursor, limit))
        return self.cursor_pages.get(cursor, CursorPage(events=[], next_cursor=cursor))

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        self.asked.append((after, limit))
        later = [e for e in self.events if after is None or (e.timestamp or 0) > after]
        return TimestampPage(events=later[:limit], finality_watermark=self.watermark)


class CountingFailpoints(Failpoints):
    """Raises at ``name`` on its ``nth`` hit only: a crash after that many events."""

    def __init__(self, name: str, nth: int = 1) -> None:
        super().__init__({})
        self.name, self.nth, self.hits = name, nth, 0

    async def hit(self, name: str) -> None:
        if name == self.name:
            self.hits += 1
            if self.hits == self.nth:
                raise FailpointError(name)


def observer(
    spec: FeedSpec,
    feed: ScriptedFeed,
    store: SettlementStore,
    feed_store: FeedStore,
    engine: AsyncEngine,
    clock: Clock,
    *,
    failpoints: Failpoints | None = None,
    grace: float = 60.0,
    page_size: int = 10,
    audit_window: float = 300.0,
) -> FeedObserver:
    return FeedObserver(
        spec,
        feed,
        feed_store,
        store,
        RetentionStore(engine, Retention(default=60, tombstone=60)),
        secret=SECRET,
        external_routes=frozenset({PAYOUTS}),
        failpoints=failpoints or Failpoints({}),
        clock=clock,
        page_size=page_size,
        unknown_grace=grace,
        poll_interval=1.0,
        max_backoff=8.0,
        audit_window=audit_window,
    )


async def unknown_payout(
    store: SettlementStore, principal_id: uuid.UUID, clock: Clock, **overrides: Any
) -> Any:
    """A payout whose answer was lost: claimed, then settled ``unknown``."""
    scope = make_scope(principal_id, route=PAYOUTS)
    request = claim_request(principal_id, clock, **overrides)
    claimed = await store.claim(scope, request, lease_token="t")
    assert isinstance(claimed.decision, Claim) and claimed.record is not None
    record = claimed.record
    operation_id = uuid.UUID(record.reservation.operation_id)
    lost = make_observation(
        "unknown", reservation=record.reservation, fencing_token=record.fencing_token
    )
    settled = await store.settle(operation_id, lost)
    assert settled.record.state is OperationState.UNKNOWN
    return record.reservation


def event(
    reservation: Any,
    event_id: str,
    *,
    position: int | None = None,
    timestamp: int | None = None,
    secret: str = SECRET,
) -> RawEvent:
    body = {"reference": event_id, "amount": 10}
    evidence = Evidence(
        operation_id=uuid.UUID(reservation.operation_id),
        binding_generation=reservation.binding_generation,
        request_fingerprint=reservation.request_fingerprint,
        outcome="completed",
        result=EvidenceResult(status=201, body=body),
        result_digest=result_digest(201, content_type_for("completed"), canonical(body)),
        issued_at="2026-12-03T00:00:00Z",
    )
    return RawEvent(
        event_id=event_id,
        evidence=msgspec.Raw(msgspec.json.encode(evidence)),
        signature=sign(evidence, secret),
        position=position,
        timestamp=timestamp,
    )


def foreign(event_id: str, operation_id: str | None = None, **order: int) -> RawEvent:
    """An event about an operation that is not here (yet: ``operation_id`` may come later,
    claimed with the factories' fingerprint and generation 1)."""
    reservation = type("R", (), {})()
    reservation.operation_id = operation_id or str(uuid.uuid4())
    reservation.binding_generation = 1
    reservation.request_fingerprint = "e" * 64 if operation_id is None else "f" * 64
    return event(reservation, event_id, **order)


async def set_checkpoint(engine: AsyncEngine, name: str, kind: str, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(feed_checkpoints.insert().values(name=name, kind=kind, **values))


async def receipt_states(engine: AsyncEngine, name: str) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(feed_receipts.c.event_id, feed_receipts.c.state).where(
                feed_receipts.c.feed == name
            )
        )
        return {row.event_id: row.state for row in rows}


async def feed_settlements(engine: AsyncEngine, operation_id: str) -> int:
    async with engine.connect() as conn:
        found = await conn.execute(
            select(func.count()).where(
                observations.c.operation_id == uuid.UUID(operation_id),
                observations.c.source == Source.FEED.value,
            )
        )
        return int(found.scalar_one())


# -- the worked examples -----------------------------------------------------------------------


async def test_cursor_c7_crash_after_106_resumes_with_107_then_promotes_c8(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    ops = {n: await unknown_payout(store, principal_id, clock) for n in (104, 106, 107)}
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C7", applied_position=105)
    feed = ScriptedFeed(spec)
    feed.cursor_pages["C7"] = CursorPage(
        events=[event(ops[n], f"e{n}", position=n) for n in (104, 106, 107)], next_cursor="C8"
    )
    # 104 was applied before the checkpoint moved to C7
    first = observer(spec, feed, store, feed_store, engine, clock)
    async with engine.begin() as conn:
        await conn.execute(
            feed_receipts.insert().values(
                feed=feed_name, event_id="e104", event_order=104, state="applied",
                reason="applied", first_seen_at=datetime.now(UTC), decided_at=datetime.now(UTC),
            )
        )  # fmt: skip

    crashing = observer(
        spec, feed, store, feed_store, engine, clock,
        failpoints=CountingFailpoints("observer.event.after_commit", nth=1),
    )  # fmt: skip
    page = await crashing.run_once()
    assert page.result is PageResult.UNAVAILABLE
    assert await receipt_states(engine, feed_name) == {"e104": "applied", "e106": "applied"}
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C7", 105)

    page = await first.run_once()
    assert page.result is PageResult.PROMOTED and page.processed == 1
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C8", 107)
    assert (
        await store.reads.get(uuid.UUID(ops[107].operation_id))
    ).state is OperationState.COMPLETED  # type: ignore[union-attr]
    for n in (106, 107):
        assert await feed_settlements(engine, ops[n].operation_id) == 1
    assert await feed_settlements(engine, ops[104].operation_id) == 0


async def test_a_quarantine_decided_only_in_memory_keeps_the_prefix_at_210(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    ops = {n: await unknown_payout(store, principal_id, clock) for n in (210, 212)}
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C9", applied_position=209)
    feed = ScriptedFeed(spec)
    feed.cursor_pages["C9"] = CursorPage(
        events=[
            event(ops[210], "e210", position=210),
            foreign("e211", position=211),  # no such operation: quarantined at once (grace 0)
            event(ops[212], "e212", position=212),
        ],
        next_cursor="C10",
    )
    crashing = observer(
        spec, feed, store, feed_store, engine, clock, grace=0.0,
        failpoints=CountingFailpoints("observer.quarantine.before"),
    )  # fmt: skip
    assert (await crashing.run_once()).result is PageResult.UNAVAILABLE
    assert await receipt_states(engine, feed_name) == {"e210": "applied"}
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C9", 209)

    again = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    assert (await again.run_once()).result is PageResult.PROMOTED
    assert await receipt_states(engine, feed_name) == {
        "e210": "applied",
        "e211": "quarantined",
        "e212": "applied",
    }
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("C10", 212)


async def test_a_tie_group_across_pages_closes_only_when_whole_and_durable(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "timestamp", "http://feed.invalid/ts", TIMESTAMP_PROMISES)
    ops = {n: await unknown_payout(store, principal_id, clock) for n in "ABCD"}
    await set_checkpoint(engine, feed_name, "timestamp", closed_through_timestamp=1000)
    feed = ScriptedFeed(spec)
    feed.events = [
        event(ops["A"], "A", timestamp=1001),
        event(ops["B"], "B", timestamp=1001),
        event(ops["C"], "C", timestamp=1001),
        event(ops["D"], "D", timestamp=1002),
    ]
    feed.watermark = 1002
    crashing = observer(
        spec, feed, store, feed_store, engine, clock, page_size=2,
        failpoints=CountingFailpoints("observer.event.after_commit", nth=2),
    )  # fmt: skip
    assert (await crashing.run_once()).result is PageResult.UNAVAILABLE  # after A and B
    assert await receipt_states(engine, feed_name) == {"A": "applied", "B": "applied"}

    resumed = observer(spec, feed, store, feed_store, engine, clock, page_size=2)
    # A and B fill a page of 2: nothing closes, the next page is larger
    assert (await resumed.run_once()).result is PageResult.GROW
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 1000
    # the page of 4 holds C and D: C is made durable, then 10:01 closes (the page is full,
    # so 10:02 may be cut and stays open)
    assert (await resumed.run_once()).result is PageResult.PROMOTED
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 1001
    assert (await receipt_states(engine, feed_name))["C"] == "applied"
    # D is asked for again (strictly after 10:01), already final; the watermark closes 10:02
    assert (await resumed.run_once()).result is PageResult.PROMOTED
    assert feed.asked[-1] == (1001, 2)
    assert (
        await feed_store.checkpoints.checkpoint(feed_name, "timestamp")
    ).closed_through_timestamp == 1002
    for n in "ABCD":
        assert await feed_settlements(engine, ops[n].operation_id) == 1


# -- holds, grace, contract breaks ---------------------------------------------------------------


async def test_a_bad_signature_holds_the_barrier_until_an_operator_decides(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    good, bad = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(
        events=[event(good, "g", position=1), event(bad, "b", position=2, secret="forged")],
        next_cursor="N",
    )
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    for _ in range(3):  # held: the same page again and again, never past it
        assert (await watcher.run_once()).result is PageResult.BLOCKED
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).resume_cursor == ""
    assert (await store.reads.get(uuid.UUID(bad.operation_id))).state is OperationState.UNKNOWN  # type: ignore[union-attr]
    [hold], open_holds, _ = await feed_store.receipts.holds(feed_name)
    assert open_holds == 1
    assert (hold.event_id, hold.reason) == ("b", "bad-signature")
    assert {a.kind for a in await feed_store.alarms.recent(feed_name)} == {"bad-signature"}
    # the operator quarantines it: the barrier opens
    await feed_store.receipts.refuse_event(
        feed_name, "b", 2, uuid.UUID(bad.operation_id), None, "quarantined",
        "operator-quarantine", datetime.now(UTC),
    )  # fmt: skip
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).resume_cursor == "N"


async def age_receipt(engine: AsyncEngine, name: str, event_id: str, seconds: float) -> None:
    """Make the event first seen ``seconds`` earlier: the grace runs on the database's clock."""
    r = feed_receipts.c
    async with engine.begin() as conn:
        await conn.execute(
            update(feed_receipts)
            .where(r.feed == name, r.event_id == event_id)
            .values(first_seen_at=r.first_seen_at - timedelta(seconds=seconds))
        )


async def test_an_unknown_operation_is_held_for_the_grace_period_then_quarantined(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[foreign("x", position=1)], next_cursor="N")
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=30.0)
    assert (await watcher.run_once()).result is PageResult.BLOCKED
    assert (await receipt_states(engine, feed_name)) == {"x": "held"}
    await age_receipt(engine, feed_name, "x", 28)
    assert (await watcher.run_once()).result is PageResult.BLOCKED
    await age_receipt(engine, feed_name, "x", 3)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert (await receipt_states(engine, feed_name)) == {"x": "quarantined"}


async def test_a_conflicting_identity_or_a_regression_stops_the_page_with_an_alarm(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    a, b = [await unknown_payout(store, principal_id, clock) for _ in range(2)]
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(a, "a", position=5)], next_cursor="P5")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    # the next page serves another event at the served position 5
    feed.cursor_pages["P5"] = CursorPage(
        events=[event(b, "imposter", position=5), event(b, "b", position=6)], next_cursor="P6"
    )
    assert (await watcher.run_once()).result is PageResult.STOPPED
    feed.cursor_pages["P5"] = CursorPage(
        events=[event(b, "b", position=7), event(b, "c", position=6)], next_cursor="P7"
    )
    assert (await watcher.run_once()).result is PageResult.STOPPED
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).resume_cursor == "P5"
    assert await receipt_states(engine, feed_name) == {"a": "applied"}
    kinds = {a.kind for a in await feed_store.alarms.recent(feed_name)}
    assert kinds == {"conflicting-identity", "regression"}


async def test_a_stuck_token_backs_off_up_to_the_bound(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    a = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(a, "a", position=1)], next_cursor="")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    waits = []
    for _ in range(6):
        page = await watcher.run_once()
        assert page.result is PageResult.STUCK
        waits.append(watcher.wait_after(page))
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert {a.kind for a in await feed_store.alarms.recent(feed_name)} == {"stuck-token"}
    assert [a.count for a in await feed_store.alarms.recent(feed_name)] == [6]


async def test_a_backfilled_or_late_event_is_processed_and_alarmed_never_skipped(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    late = await unknown_payout(store, principal_id, clock)
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C", applied_position=50)
    feed = ScriptedFeed(spec)
    feed.cursor_pages["C"] = CursorPage(events=[event(late, "old", position=40)], next_cursor="D")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert await receipt_states(engine, feed_name) == {"old": "applied"}
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).applied_position == 50
    assert {a.kind for a in await feed_store.alarms.recent(feed_name)} == {"backfill"}


async def test_two_observers_on_one_feed_apply_each_event_once_and_never_regress(
    engine: AsyncEngine,
    open_engine: Any,
    store: SettlementStore,
    clock: Clock,
    pool: Any,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    ops = [await unknown_payout(store, principal_id, clock) for _ in range(12)]
    feed = ScriptedFeed(spec)
    cursors = [""] + [f"K{n}" for n in range(1, 5)]
    for n in range(4):
        chunk = ops[3 * n : 3 * n + 3]
        feed.cursor_pages[cursors[n]] = CursorPage(
            events=[
                event(op, f"e{3 * n + i}", position=3 * n + i + 1) for i, op in enumerate(chunk)
            ],
            next_cursor=cursors[n + 1],
        )
    other_engine = open_engine()
    other_store = SettlementStore(other_engine, clock=clock, pool=pool)
    stores = [
        FeedStore(engine, store.runner, settle=store.settle_phase_of),
        FeedStore(other_engine, other_store.runner, settle=other_store.settle_phase_of),
    ]
    watchers = [
        observer(spec, feed, s, f, e, clock)
        for s, f, e in ((store, stores[0], engine), (other_store, stores[1], other_engine))
    ]
    versions = []
    for _ in range(8):
        await asyncio.gather(*(w.run_once() for w in watchers))
        checkpoint = await stores[0].checkpoints.checkpoint(feed_name, "cursor")
        versions.append((checkpoint.version, checkpoint.applied_position or 0))
    assert versions == sorted(versions)
    checkpoint = await stores[0].checkpoints.checkpoint(feed_name, "cursor")
    assert (checkpoint.resume_cursor, checkpoint.applied_position) == ("K4", 12)
    for op in ops:
        assert await feed_settlements(engine, op.operation_id) == 1
        assert (await store.reads.get(uuid.UUID(op.operation_id))).state is OperationState.COMPLETED  # type: ignore[union-attr]


async def test_the_feed_settlement_is_a_feed_observation_of_the_operation(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    op = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[event(op, "only", position=1)], next_cursor="E")
    await observer(spec, feed, store, feed_store, engine, clock).run_once()
    async with engine.connect() as conn:
        row = (
            (
                await conn.execute(
                    select(observations).where(
                        observations.c.operation_id == uuid.UUID(op.operation_id),
                        observations.c.source == "feed",
                    )
                )
            )
            .mappings()
            .one()
        )
    assert (row["kind"], row["disposition"], row["verified"]) == ("completed", "applied", True)
    assert row["detail"] == {"feed": feed_name, "event_id": "only"}
    receipt = await feed_store.receipts.receipt(feed_name, "only")
    assert receipt is not None and receipt.observation_id == row["id"]
    assert ObservationKind.COMPLETED.value == "completed"
    async with engine.begin() as conn:  # a later page cannot re-apply it, even if asked to
        await conn.execute(
            update(feed_checkpoints)
            .where(feed_checkpoints.c.name == feed_name)
            .values(resume_cursor="")
        )
    await observer(spec, feed, store, feed_store, engine, clock).run_once()
    assert await feed_settlements(engine, op.operation_id) == 1


async def test_the_run_loop_survives_a_failed_page_but_not_a_termination(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``settlement observer run`` stops on SIGTERM by raising from the signal handler in
    whatever code runs: a page that fails is logged and the loop goes on, but the
    termination must leave the loop even when it lands inside a page (it once did not: an
    observer outlived its server)."""
    from service.cli import _Terminated

    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    watcher = observer(spec, ScriptedFeed(spec), store, feed_store, engine, clock)
    pages = 0

    async def page() -> Any:
        nonlocal pages
        pages += 1
        if pages == 1:
            raise RuntimeError("a page that fails")  # logged; the loop goes on
        raise _Terminated

    monkeypatch.setattr(watcher, "run_once", page)
    monkeypatch.setattr(watcher, "wait_after", lambda _page: 0.0)
    with pytest.raises(_Terminated):
        await asyncio.wait_for(watcher.run(), 5)
    assert pages == 2
