"""What one feed event's outcome is (service/app/feed_events.py), against real PostgreSQL with
a scripted feed: a replay and a tuple mismatch (H3), a local effect's operation (H4), a purged
operation (H5), an event served again after its receipt was purged (R7), a hold that kept no
event (H11), and the pace, batch and order of the holds' re-drive (H13)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_events import event_digest
from service.app.observer import AUDIT_EVERY, HOLD_BATCH, PageResult
from service.config import TIMESTAMP_PROMISES, FeedSpec
from service.core import Claim, OperationState, Source, TerminalPolicy
from service.domain.feeds import CursorPage, RawEvent, decode_signed
from service.evidence import (
    Evidence,
    EvidenceResult,
    canonical,
    content_type_for,
    observation_of,
    result_digest,
    sign,
)
from service.store.feed_tables import feed_receipts
from service.store.feeds import FeedStore
from service.store.retention import Retention, RetentionStore
from service.store.rows import at
from service.store.settlement import SettlementStore
from service.store.tables import observations, operations, tombstones
from tests.integration.factories import Clock, claim_request, count, make_scope
from tests.integration.test_feed_observer import (
    SECRET,
    ScriptedFeed,
    feed_settlements,
    foreign,
    observer,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)

pytestmark = pytest.mark.integration

BODY = {"reference": "payout-1", "amount": 10}
# what the store's default retention keeps a terminal operation (SettlementStore's default)
KEPT = 86_400.0


def signed(
    reservation: Any,
    event_id: str,
    *,
    outcome: str = "completed",
    body: dict[str, Any] | None = None,
    **order: int,
) -> RawEvent:
    """An event whose evidence is signed with the observer's secret; unlike the shared
    ``event``, its result body is the same for every event id unless ``body`` says otherwise,
    so two events may carry the same outcome (a replay)."""
    body = BODY if body is None else body
    status = 201 if outcome == "completed" else 402
    evidence = Evidence(
        operation_id=uuid.UUID(reservation.operation_id),
        binding_generation=reservation.binding_generation,
        request_fingerprint=reservation.request_fingerprint,
        outcome=outcome,  # type: ignore[arg-type]
        result=EvidenceResult(status=status, body=body),
        result_digest=result_digest(status, content_type_for(outcome), canonical(body)),
        issued_at="2026-12-03T00:00:00Z",
    )
    return RawEvent(
        event_id=event_id,
        evidence=msgspec.Raw(msgspec.json.encode(evidence)),
        signature=sign(evidence, SECRET),
        **order,
    )


digest_of = event_digest  # the digest the observer keeps of an event as served


async def feed_decisions(engine: AsyncEngine, operation_id: str) -> list[tuple[str, str]]:
    """(disposition, reason) of every feed observation of the operation, oldest first."""
    o = observations.c
    async with engine.connect() as conn:
        found = await conn.execute(
            select(o.disposition, o.reason)
            .where(o.operation_id == uuid.UUID(operation_id), o.source == Source.FEED.value)
            .order_by(o.id)
        )
        return [(row.disposition, row.reason) for row in found]


async def revision(store: SettlementStore, operation_id: str) -> tuple[OperationState, int]:
    record = await store.reads.get(uuid.UUID(operation_id))
    assert record is not None
    return record.state, record.revision


async def purge_settled(engine: AsyncEngine, clock: Clock) -> None:
    """Let every terminal operation expire and run the retention purge over them (as
    tests/integration/test_retention.py does): each becomes a tombstone."""
    clock.advance(KEPT + 1)
    purging = RetentionStore(engine, Retention(default=KEPT, tombstone=600.0))
    while (await purging.purge(500, at(clock()))).full:
        pass


async def forget_receipt(engine: AsyncEngine, feed: str, event_id: str) -> None:
    """What RetentionStore.forget_feed_rows does to a final receipt out of reach."""
    r = feed_receipts.c
    async with engine.begin() as conn:
        gone = await conn.execute(
            delete(feed_receipts).where(r.feed == feed, r.event_id == event_id)
        )
    assert gone.rowcount == 1


# -- H3: the receipt says what the core decided -----------------------------------------------


async def test_a_replayed_outcome_settles_the_operation_once(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """Two events carry the same outcome of one payout: the first settles it, the second is a
    replay: a final receipt, the row untouched, and the barrier passes both."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    op = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(
        events=[signed(op, "first", position=1), signed(op, "again", position=2)],
        next_cursor="N",
    )
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    state, settled_at = await revision(store, op.operation_id)
    assert state is OperationState.COMPLETED
    decisions = await feed_decisions(engine, op.operation_id)
    assert [d for d in decisions if d[0] == "applied"] == [("applied", "terminal-applied")]
    assert decisions[1:] == [("strengthened", "same-digest")]
    again = await feed_store.receipts.receipt(feed_name, "again")
    assert again is not None and again.reason == "same-digest"
    assert again.state == "ignored"  # a replay
    assert (await feed_store.receipts.receipt(feed_name, "first")).state == "applied"  # type: ignore[union-attr]
    # served once more (a new id, the same outcome): still nothing written on the row
    feed.cursor_pages["N"] = CursorPage(events=[signed(op, "third", position=3)], next_cursor="M")
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert await revision(store, op.operation_id) == (OperationState.COMPLETED, settled_at)
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).applied_position == 3
    assert [d[0] for d in await feed_decisions(engine, op.operation_id)] == [
        "applied",
        "strengthened",
        "strengthened",
    ]


async def test_a_replayed_outcome_gets_an_ignored_receipt(
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
    feed.cursor_pages[""] = CursorPage(
        events=[signed(op, "first", position=1), signed(op, "again", position=2)],
        next_cursor="N",
    )
    assert (await observer(spec, feed, store, feed_store, engine, clock).run_once()).processed == 2
    assert await receipt_states(engine, feed_name) == {"first": "applied", "again": "ignored"}


async def test_an_outcome_the_core_ignores_gets_an_ignored_receipt(
    engine: AsyncEngine,
    store: SettlementStore,
    clock: Clock,
    pool: Any,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """Under the completed-wins policy a ``failed`` after ``completed`` loses the merge: the
    core ignores it, and the receipt says so; the row keeps its success."""
    winning = SettlementStore(engine, clock=clock, pool=pool, policy=TerminalPolicy.COMPLETED_WINS)
    feeds = FeedStore(engine, winning.runner, settle=winning.settle_phase_of)
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    op = await unknown_payout(winning, principal_id, clock)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(
        events=[
            signed(op, "paid", position=1),
            signed(op, "refused", outcome="failed", body={"title": "declined"}, position=2),
        ],
        next_cursor="N",
    )
    assert (await observer(spec, feed, winning, feeds, engine, clock).run_once()).processed == 2
    assert await receipt_states(engine, feed_name) == {"paid": "applied", "refused": "ignored"}
    assert (await feeds.receipts.receipt(feed_name, "refused")).reason == "failed-after-completed"  # type: ignore[union-attr]
    assert (await revision(winning, op.operation_id))[0] is OperationState.COMPLETED
    assert await feed_decisions(engine, op.operation_id) == [
        ("applied", "terminal-applied"),
        ("ignored", "failed-after-completed"),
    ]


@pytest.mark.parametrize("field", ["binding_generation", "request_fingerprint"])
async def test_evidence_of_another_tuple_is_quarantined_by_the_core_and_blocks_nothing(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    field: str,
) -> None:
    """Evidence about the operation under another epoch or request is not about this
    reservation: quarantined (tuple-mismatch), the row untouched; the exact match after it
    in the page settles the operation."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    op = await unknown_payout(store, principal_id, clock)
    other = {"binding_generation": 2, "request_fingerprint": "a" * 64}[field]
    stale = msgspec.structs.replace(op, **{field: other})
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[signed(stale, "stale", position=1)], next_cursor="N")
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    _, before = await revision(store, op.operation_id)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    receipt = await feed_store.receipts.receipt(feed_name, "stale")
    assert receipt is not None
    assert (receipt.state, receipt.reason) == ("quarantined", "tuple-mismatch")
    assert await revision(store, op.operation_id) == (OperationState.UNKNOWN, before)
    assert await feed_decisions(engine, op.operation_id) == [("quarantined", "tuple-mismatch")]
    feed.cursor_pages["N"] = CursorPage(events=[signed(op, "exact", position=2)], next_cursor="M")
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert (await receipt_states(engine, feed_name))["exact"] == "applied"
    assert (await revision(store, op.operation_id))[0] is OperationState.COMPLETED


# -- H4, H5: operations the feed cannot settle ---------------------------------------------------


async def test_an_event_about_a_local_effects_operation_is_quarantined_not_external(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """A transfer is settled by its own transaction, never by a provider's feed: an event
    about it is quarantined (not-external) and its row is left as it is."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    scope = make_scope(principal_id)  # POST /v1/transfers: not an external route
    claimed = await store.claim(scope, claim_request(principal_id, clock), lease_token="t")
    assert isinstance(claimed.decision, Claim) and claimed.record is not None
    local = claimed.record.reservation
    before = await revision(store, local.operation_id)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[signed(local, "local", position=1)], next_cursor="N")
    assert (await observer(spec, feed, store, feed_store, engine, clock).run_once()).result is (
        PageResult.PROMOTED
    )
    receipt = await feed_store.receipts.receipt(feed_name, "local")
    assert receipt is not None
    assert (receipt.state, receipt.reason) == ("quarantined", "not-external")
    assert receipt.operation_id == uuid.UUID(local.operation_id)
    assert await revision(store, local.operation_id) == before
    assert before[0] is OperationState.IN_PROGRESS
    assert await feed_decisions(engine, local.operation_id) == [("quarantined", "not-external")]


async def test_an_event_about_a_purged_operation_is_quarantined_and_recorded(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """The payout was settled elsewhere (another feed) and purged by retention: a tombstone is
    all that is left. An event about it is quarantined (operation-expired), never held for
    the grace, and its observation is kept beside the tombstone."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    op = await unknown_payout(store, principal_id, clock)
    elsewhere = ScriptedFeed(FeedSpec(feed_name + "x", "cursor", "http://feed.invalid/x"))
    elsewhere.cursor_pages[""] = CursorPage(events=[signed(op, "e", position=1)], next_cursor="N")
    settled = await observer(elsewhere.spec, elsewhere, store, feed_store, engine, clock).run_once()
    assert settled.result is PageResult.PROMOTED
    await purge_settled(engine, clock)
    operation_id = uuid.UUID(op.operation_id)
    assert await count(engine, operations, operations.c.id == operation_id) == 0
    assert await count(engine, tombstones, tombstones.c.operation_id == operation_id) == 1
    assert await feed_decisions(engine, op.operation_id) == []  # gone with the operation

    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(events=[signed(op, "late", position=1)], next_cursor="N")
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=3600.0)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    receipt = await feed_store.receipts.receipt(feed_name, "late")
    assert receipt is not None
    assert (receipt.state, receipt.reason) == ("quarantined", "operation-expired")
    assert receipt.operation_id == operation_id and receipt.observation_id is not None
    async with engine.connect() as conn:
        row = (
            (
                await conn.execute(
                    select(observations).where(observations.c.id == receipt.observation_id)
                )
            )
            .mappings()
            .one()
        )
    assert row["operation_id"] == operation_id
    assert (row["source"], row["kind"], row["stage"]) == ("feed", "completed", "A")
    assert (row["disposition"], row["reason"]) == ("quarantined", "operation-expired")
    assert row["detail"] == {"feed": feed_name, "event_id": "late", "receipt": "quarantined"}
    assert await count(engine, operations, operations.c.id == operation_id) == 0


# -- R7: an event served again after its receipt was purged -------------------------------------


@pytest.mark.parametrize("fate", ["kept", "purged"])
@pytest.mark.parametrize("kind", ["cursor", "timestamp"])
async def test_an_event_served_again_after_its_receipt_was_purged_is_decided_again_never_twice(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
    kind: str,
    fate: str,
) -> None:
    """The event settled its payout and the checkpoint passed it; then its receipt was purged
    (forget_feed_rows) and, ``purged``, its operation too (a tombstone). Served again (an
    overlap page of the cursor feed; the timestamp feed's audit), it is a late event: alarmed
    and decided again: a replay of the kept operation, or operation-expired: never a second
    effect."""
    promises = TIMESTAMP_PROMISES if kind == "timestamp" else frozenset()
    spec = FeedSpec(feed_name, kind, f"http://feed.invalid/{kind}", promises)
    op = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    if kind == "cursor":
        feed.cursor_pages[""] = CursorPage(events=[signed(op, "e", position=1)], next_cursor="C1")
    else:
        await set_checkpoint(engine, feed_name, kind, closed_through_timestamp=999)
        feed.events = [signed(op, "e", timestamp=1000)]
        feed.watermark = 1000
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    checkpoint = await feed_store.checkpoints.checkpoint(feed_name, kind)
    assert (checkpoint.applied_position or checkpoint.closed_through_timestamp) in {1, 1000}
    settled = await revision(store, op.operation_id)
    assert await feed_decisions(engine, op.operation_id) == [("applied", "terminal-applied")]
    await forget_receipt(engine, feed_name, "e")
    if fate == "purged":
        await purge_settled(engine, clock)

    if kind == "cursor":  # an overlap page: the event again, behind the applied position
        feed.cursor_pages["C1"] = CursorPage(
            events=[signed(op, "e", position=1)], next_cursor="C1x"
        )
        await watcher.run_once()
        alarm = "backfill"
    else:  # main pages ask after 1000; the audit reads the window behind it
        for _ in range(AUDIT_EVERY - 1):
            assert (await watcher.run_once()).result is PageResult.CAUGHT_UP
        alarm = "late-event"
    assert {(a.kind, a.event_id) for a in await feed_store.alarms.recent(feed_name)} == {
        (alarm, "e")
    }
    receipt = await feed_store.receipts.receipt(feed_name, "e")
    assert receipt is not None
    decisions = await feed_decisions(engine, op.operation_id)
    if fate == "purged":
        assert (receipt.state, receipt.reason) == ("quarantined", "operation-expired")
        assert decisions == [("quarantined", "operation-expired")]
        return
    # a replay: a final receipt, the row not written again; the re-decision is recorded
    # as the core's strengthen (so every feed observation counts 2, one of them applied)
    assert (receipt.state, receipt.reason) in {
        ("applied", "same-digest"),
        ("ignored", "same-digest"),
    }
    assert await revision(store, op.operation_id) == settled
    assert decisions == [("applied", "terminal-applied"), ("strengthened", "same-digest")]


# -- H11, H13: holds the observer decides again on its own ---------------------------------------


async def insert_holds(
    engine: AsyncEngine, feed: str, holds: list[tuple[str, RawEvent | None, int]]
) -> None:
    """Open ``unknown-operation`` holds, each (event id, the event it kept or None, seconds
    ago it was last decided); first seen a minute ago on the database's clock."""
    now = datetime.now(UTC)
    async with engine.begin() as conn:
        await conn.execute(
            feed_receipts.insert(),
            [
                {
                    "feed": feed,
                    "event_id": event_id,
                    "event_order": n,
                    "state": "held",
                    "reason": "unknown-operation",
                    "digest": "" if raw is None else digest_of(raw),
                    "first_seen_at": now - timedelta(minutes=1),
                    "decided_at": now - timedelta(seconds=ago),
                    "evidence": None if raw is None else bytes(raw.evidence),
                    "signature": None if raw is None else raw.signature,
                }
                for n, (event_id, raw, ago) in enumerate(holds)
            ],
        )


async def test_a_hold_that_kept_no_event_waits_for_its_feed_to_serve_it_again(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    """A hold without its event (as holds written before migration 0007 are; made here
    through settle_event given no ``served``): the re-drive cannot decide it, even once the
    operation is known; it stays listed, and the feed serving the event again decides it. A
    hold that kept its event is settled by the same passes."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    operation_id = str(uuid.uuid4())
    x = foreign("x", operation_id, position=7)
    signed_x = decode_signed(x)
    assert signed_x is not None
    held, found = await feed_store.receipts.settle_event(
        feed_name, "x", 7, uuid.UUID(operation_id),
        observation_of(signed_x.evidence, Source.FEED), at(clock()), digest=digest_of(x),
    )  # fmt: skip
    assert found is None
    assert (held.state, held.reason, held.evidence) == ("held", "unknown-operation", None)
    # given the event as served (as the observer does), such a hold keeps it (another feed)
    y = foreign("y", str(uuid.uuid4()), position=8)
    signed_y = decode_signed(y)
    assert signed_y is not None
    kept, _ = await feed_store.receipts.settle_event(
        feed_name + "y", "y", 8, signed_y.evidence.operation_id,
        observation_of(signed_y.evidence, Source.FEED), at(clock()), digest=digest_of(y),
        served=(bytes(y.evidence), y.signature),
    )  # fmt: skip
    assert (kept.state, kept.evidence) == ("held", bytes(y.evidence))
    other = await unknown_payout(store, principal_id, clock)
    await insert_holds(engine, feed_name, [("kept", signed(other, "kept", position=3), 0)])
    await unknown_payout(store, principal_id, clock, new_operation_id=operation_id)

    feed = ScriptedFeed(spec)
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=0.0)
    assert await watcher.redrive_holds() == 1  # "kept" is settled; "x" cannot be
    for _ in range(3):
        clock.advance(1.0)
        assert await watcher.redrive_holds() == 0
    assert await receipt_states(engine, feed_name) == {"x": "held", "kept": "applied"}
    assert (await revision(store, operation_id))[0] is OperationState.UNKNOWN
    [hold], open_holds, _ = await feed_store.receipts.holds(feed_name)
    assert (hold.event_id, hold.evidence, open_holds) == ("x", None, 1)
    assert hold.decided_at == held.decided_at  # never decided again

    feed.cursor_pages[""] = CursorPage(events=[x], next_cursor="N")
    assert (await watcher.run_once()).result is PageResult.PROMOTED
    assert (await receipt_states(engine, feed_name))["x"] == "applied"
    assert (await revision(store, operation_id))[0] is OperationState.COMPLETED
    assert await feed_settlements(engine, operation_id) == 1
    assert (await feed_store.receipts.holds(feed_name))[1] == 0


async def test_the_holds_are_decided_again_once_per_poll_interval_fifty_at_a_time_oldest_first(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """60 holds whose grace has run out (grace 0), each about an operation not here: a pass
    quarantines the 50 least recently decided (not the first 50 by event id), the passes
    run at most once per poll interval (1 s here), and the next pass takes the other 10."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    total = HOLD_BATCH + 10
    # h00 was decided last, h59 first: event-id order is the opposite of the due order
    await insert_holds(
        engine,
        feed_name,
        [(f"h{n:02d}", foreign(f"h{n:02d}", position=n), n) for n in range(total)],
    )
    watcher = observer(spec, ScriptedFeed(spec), store, feed_store, engine, clock, grace=0.0)

    assert await watcher.redrive_holds() == HOLD_BATCH
    states = await receipt_states(engine, feed_name)
    assert {e for e, s in states.items() if s == "held"} == {f"h{n:02d}" for n in range(10)}
    assert sum(s == "quarantined" for s in states.values()) == HOLD_BATCH

    assert await watcher.redrive_holds() == 0  # not due yet
    clock.advance(0.5)
    assert (await watcher.run_once()).result is PageResult.CAUGHT_UP  # nor from the loop
    assert sum(s == "held" for s in (await receipt_states(engine, feed_name)).values()) == 10

    clock.advance(0.5)  # one poll interval after the first pass
    assert (await watcher.run_once()).result is PageResult.CAUGHT_UP
    states = await receipt_states(engine, feed_name)
    assert len(states) == total and set(states.values()) == {"quarantined"}
    assert await watcher.redrive_holds() == 0


async def test_holds_still_waiting_go_to_the_back_of_the_re_drive(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    """Holds decided again and still waiting (the grace has not run out) are decided again
    after those not yet decided: over two passes each of 60 holds is decided once or more,
    none is left behind."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    total = HOLD_BATCH + 10
    await insert_holds(
        engine,
        feed_name,
        [(f"h{n:02d}", foreign(f"h{n:02d}", position=n), n) for n in range(total)],
    )
    watcher = observer(spec, ScriptedFeed(spec), store, feed_store, engine, clock, grace=3600.0)
    assert await watcher.redrive_holds() == 0  # all still held
    first = at(clock())
    decided = {
        h.event_id: h.decided_at for h in await feed_store.receipts.due_holds(feed_name, total)
    }
    assert sorted(e for e, when in decided.items() if when == first) == [
        f"h{n:02d}" for n in range(10, total)
    ]
    clock.advance(1.0)
    assert await watcher.redrive_holds() == 0
    decided = {
        h.event_id: h.decided_at for h in await feed_store.receipts.due_holds(feed_name, total)
    }
    assert all(when >= first for when in decided.values())  # every hold decided at least once
    assert {e for e, when in decided.items() if when == at(clock())} >= {
        f"h{n:02d}" for n in range(10)
    }


async def test_holds_that_kept_no_event_do_not_starve_the_re_drive(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    empty = [(f"old{n:02d}", None, 1000 + n) for n in range(HOLD_BATCH)]
    await insert_holds(engine, feed_name, [*empty, ("kept", foreign("kept", position=99), 0)])
    watcher = observer(spec, ScriptedFeed(spec), store, feed_store, engine, clock, grace=0.0)
    for _ in range(5):
        await watcher.redrive_holds()
        clock.advance(1.0)
    assert (await receipt_states(engine, feed_name))["kept"] == "quarantined"
