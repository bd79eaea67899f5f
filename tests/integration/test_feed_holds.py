"""Holds are never forgotten: a held event behind the checkpoint is decided again by the
observer on its own (the operation now known settles it; the grace run out quarantines it),
an operator's ``retry`` decides the stored event again and never deletes it, and the admin
view lists every open hold with its age. Real PostgreSQL, a scripted feed."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.feed_events import FeedEvents
from service.app.feeds import FeedAdmin, FeedView, HoldAction
from service.config import FeedSpec
from service.core import OperationState
from service.domain.feeds import CursorPage
from service.domain.principals import Principal
from service.failpoints import Failpoints
from service.store.feeds import FeedStore
from service.store.retention import Retention, RetentionStore
from service.store.settlement import SettlementStore
from tests.integration.factories import Clock
from tests.integration.test_feed_observer import (
    PAYOUTS,
    SECRET,
    ScriptedFeed,
    age_receipt,
    event,
    feed_settlements,
    foreign,
    observer,
    receipt_states,
    set_checkpoint,
    unknown_payout,
)

pytestmark = pytest.mark.integration

GRACE = 60.0  # the setting's default
ADMIN = Principal(
    id=uuid.uuid4(), tenant="ops", name="ops", role="admin", credential_generation=1,
    all_tenants=True,
)  # fmt: skip


def admin_of(
    engine: AsyncEngine, store: SettlementStore, feed_store: FeedStore, clock: Clock, spec: FeedSpec
) -> FeedAdmin:
    """The admin as the server makes it: a retry decides the stored event again."""
    events = FeedEvents(
        feed_store,
        store,
        RetentionStore(engine, Retention(default=60, tombstone=60)),
        secret=SECRET,
        external_routes=frozenset({PAYOUTS}),
        failpoints=Failpoints({}),
        clock=clock,
        unknown_grace=GRACE,
    )
    return FeedAdmin(
        feed_store, [spec], clock=clock, events=events, external_routes=frozenset({PAYOUTS})
    )


async def held_behind_the_checkpoint(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
    operation_id: str | None = None,
) -> tuple[FeedSpec, ScriptedFeed, object]:
    """The issue's scenario: checkpoint C at 50; an overlap page serves x@40 about an
    operation not known yet (held), with next cursor D. x is behind the applied position,
    so its hold does not hold the barrier: the checkpoint moves to D, and x stays held
    behind it, served by no page again."""
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor", frozenset({"no-backfill"}))
    await set_checkpoint(engine, feed_name, "cursor", resume_cursor="C", applied_position=50)
    feed = ScriptedFeed(spec)
    feed.cursor_pages["C"] = CursorPage(
        events=[foreign("x", operation_id, position=40)], next_cursor="D"
    )
    watcher = observer(spec, feed, store, feed_store, engine, clock, grace=GRACE)
    assert (await watcher.run_once()).result.value == "promoted"
    assert await receipt_states(engine, feed_name) == {"x": "held"}
    assert (await feed_store.checkpoints.checkpoint(feed_name, "cursor")).resume_cursor == "D"
    clock.advance(2)
    return spec, feed, watcher


async def test_a_hold_behind_the_checkpoint_is_quarantined_when_its_grace_runs_out(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    feed_name: str,
) -> None:
    spec, feed, watcher = await held_behind_the_checkpoint(
        engine, store, feed_store, clock, feed_name
    )
    # the admin view lists it, with its age
    view = await admin_of(engine, store, feed_store, clock, spec).show(ADMIN, feed_name)
    assert isinstance(view, FeedView) and view.open_holds == 1
    [hold] = view.holds
    assert (hold.event_id, hold.reason, hold.kept) == ("x", "unknown-operation", True)
    assert 0 <= hold.age < GRACE
    await age_receipt(engine, feed_name, "x", GRACE + 1)
    asked = len(feed.asked)
    clock.advance(2)
    await watcher.run_once()  # type: ignore[attr-defined]
    # decided from the event the hold kept: the feed never served x again
    assert all(cursor == "D" for cursor, _ in feed.asked[asked:])
    assert await receipt_states(engine, feed_name) == {"x": "quarantined"}
    view = await admin_of(engine, store, feed_store, clock, spec).show(ADMIN, feed_name)
    assert isinstance(view, FeedView) and (view.open_holds, view.holds) == (0, [])


async def test_a_hold_behind_the_checkpoint_settles_once_its_operation_is_known(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    operation_id = str(uuid.uuid4())
    _, _, watcher = await held_behind_the_checkpoint(
        engine, store, feed_store, clock, feed_name, operation_id
    )
    await unknown_payout(store, principal_id, clock, new_operation_id=operation_id)
    clock.advance(2)
    await watcher.run_once()  # type: ignore[attr-defined]
    assert await receipt_states(engine, feed_name) == {"x": "applied"}
    settled = await store.reads.get(uuid.UUID(operation_id))
    assert settled is not None and settled.state is OperationState.COMPLETED
    assert await feed_settlements(engine, operation_id) == 1


async def test_an_operator_retry_decides_the_stored_event_again_and_never_deletes_it(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    operation_id = str(uuid.uuid4())
    spec, _, _ = await held_behind_the_checkpoint(
        engine, store, feed_store, clock, feed_name, operation_id
    )
    admin = admin_of(engine, store, feed_store, clock, spec)
    # the operation is still unknown: the retry decides to hold, and the hold stays
    retried = await admin.decide(ADMIN, feed_name, "x", HoldAction("retry"))
    assert getattr(retried, "state", None) == "held"
    assert await receipt_states(engine, feed_name) == {"x": "held"}
    [kept] = (await feed_store.receipts.holds(feed_name))[0]
    assert kept.evidence is not None  # its only record still holds the event
    # the operation arrives: the next retry settles the stored event at once
    await unknown_payout(store, principal_id, clock, new_operation_id=operation_id)
    retried = await admin.decide(ADMIN, feed_name, "x", HoldAction("retry"))
    assert getattr(retried, "state", None) == "applied"
    assert await receipt_states(engine, feed_name) == {"x": "applied"}
    assert await feed_settlements(engine, operation_id) == 1


async def test_a_retry_of_a_bad_signature_keeps_the_hold_and_quarantine_is_final(
    engine: AsyncEngine,
    store: SettlementStore,
    feed_store: FeedStore,
    clock: Clock,
    principal_id: uuid.UUID,
    feed_name: str,
) -> None:
    spec = FeedSpec(feed_name, "cursor", "http://feed.invalid/cursor")
    bad = await unknown_payout(store, principal_id, clock)
    feed = ScriptedFeed(spec)
    feed.cursor_pages[""] = CursorPage(
        events=[event(bad, "b", position=1, secret="forged")], next_cursor="N"
    )
    watcher = observer(spec, feed, store, feed_store, engine, clock)
    assert (await watcher.run_once()).result.value == "blocked"
    admin = admin_of(engine, store, feed_store, clock, spec)
    retried = await admin.decide(ADMIN, feed_name, "b", HoldAction("retry"))
    assert getattr(retried, "state", None) == "held"  # the signature still does not verify
    assert await receipt_states(engine, feed_name) == {"b": "held"}
    decided = await admin.decide(ADMIN, feed_name, "b", HoldAction("quarantine"))
    assert getattr(decided, "state", None) == "quarantined"
    again = await admin.decide(ADMIN, feed_name, "b", HoldAction("retry"))
    assert getattr(again, "slug", None) == "not-found"  # final: nothing left to retry
    assert await receipt_states(engine, feed_name) == {"b": "quarantined"}
    assert (await watcher.run_once()).result.value == "promoted"
