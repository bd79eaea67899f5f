"""Feed administration (docs/design.md §8): what each feed observer has done, and operator decisions
on held events. Feeds span tenants, so only an all-tenant admin may read or act on them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

import msgspec

from service.app.answers import Problem
from service.app.feed_events import FeedEvents
from service.app.feed_stalls import Stall, read_stalls
from service.config import FEED_NAME, FeedSpec
from service.domain.principals import Principal
from service.store.feed_alarms import Alarm, InOnePage
from service.store.feed_checkpoints import Checkpoint
from service.store.feed_receipts import Receipt
from service.store.feeds import FeedStore
from service.store.keyset import BadCursor

__all__ = [
    "ConflictAccepted",
    "ConflictAction",
    "FeedAdmin",
    "FeedView",
    "HoldAction",
    "HoldDecided",
    "HoldPage",
]

log = logging.getLogger("settlement.feeds")


class HoldAction(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    action: Literal["quarantine", "retry"]


class HoldView(msgspec.Struct):
    event_id: str
    order: int
    operation_id: str | None
    reason: str
    first_seen_at: datetime
    age: float
    """seconds since the event was first seen (the database's clock)"""
    kept: bool
    """whether the hold keeps its event (it can be decided again without the feed)"""


class AlarmView(msgspec.Struct):
    kind: str
    event_id: str
    detail: str
    count: int
    first_at: datetime
    last_at: datetime


class FeedView(msgspec.Struct, omit_defaults=True):
    """A cursor feed shows ``resume_cursor`` and ``applied_position``; a timestamp feed
    ``closed_through_timestamp``."""

    name: str
    kind: str
    configured: bool
    promises: list[str]
    """what the source is configured to promise (SETTLEMENT_FEED_PROMISES), all the observer
    relies on; empty for cursor feeds and feeds not configured here"""
    checkpoint_version: int
    lag: float | None
    """seconds since the observer last found nothing new (None: it never has)"""
    oldest_unknown: float | None
    """seconds since the longest-unknown external operation became unknown (None: there is
    none): what the feeds should settle, so a feed that looks caught up while this grows is
    stuck"""
    holds: list[HoldView]
    """the open holds, oldest first (at most 100; ``open_holds`` counts them all)"""
    open_holds: int
    alarms: list[AlarmView]
    resume_cursor: str | None = None
    applied_position: int | None = None
    closed_through_timestamp: int | None = None


class FeedList(msgspec.Struct):
    items: list[FeedView]


class HoldPage(msgspec.Struct):
    """Every open hold of a feed, a page at a time, oldest first."""

    items: list[HoldView]
    open_holds: int
    next: str | None
    """the ``after`` of the next page (None: this is the last)"""


class ConflictAction(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    action: Literal["accept"]


class ConflictAccepted(msgspec.Struct):
    feed: str
    event_id: str
    unpinned: list[str]
    """the events whose receipts no longer hold their place and content against the feed
    (their outcomes stay)"""


class HoldDecided(msgspec.Struct):
    feed: str
    event_id: str
    action: str
    state: str
    """the receipt's state after the decision (``held`` when a retry decided to hold)"""


class FeedAdmin:
    def __init__(
        self,
        store: FeedStore,
        specs: list[FeedSpec],
        *,
        clock: Callable[[], float],
        events: FeedEvents,
        external_routes: frozenset[str],
        stall_after: float | None = None,
    ) -> None:
        """``events``: decides a held event again on an operator's ``retry``.
        ``external_routes``: the routes whose ``unknown`` operations the feeds settle (their
        age is the feeds' true lag). ``stall_after``: ``SETTLEMENT_FEED_STALL_AFTER`` (None:
        no feed is flagged stalled)."""
        self._stall_after = stall_after
        self._store = store
        self._events = events
        self._external = sorted(external_routes)
        self._specs = {spec.name: spec for spec in specs}
        self._clock = clock

    async def list(self, admin: Principal) -> FeedList | Problem:
        if not admin.all_tenants:
            return _forbidden()
        checkpoints = {c.name: c for c in await self._store.checkpoints.all()}
        names = sorted(set(checkpoints) | set(self._specs))
        return FeedList([await self._view(n, checkpoints.get(n)) for n in names])

    async def stalls(self, admin: Principal) -> dict[str, Stall] | Problem:
        """Each feed's stall by name (:mod:`service.app.feed_stalls`), flagged or not."""
        if not admin.all_tenants:
            return _forbidden()
        found = await read_stalls(self._store, self._external, self._clock, self._stall_after)
        return {stall.feed: stall for stall in found}

    async def show(self, admin: Principal, name: str) -> FeedView | Problem:
        if not admin.all_tenants:
            return _forbidden()
        if not FEED_NAME.match(name):
            return Problem("not-found", f"no feed {name[:64]!r}")
        found = await self._checkpoint(name)
        if found is None and name not in self._specs:
            return Problem("not-found", f"no feed {name!r}")
        return await self._view(name, found)

    async def holds(
        self, admin: Principal, name: str, limit: int, after: str | None
    ) -> HoldPage | Problem:
        if not admin.all_tenants:
            return _forbidden()
        if not FEED_NAME.match(name):
            return Problem("not-found", f"no feed {name[:64]!r}")
        if name not in self._specs and await self._checkpoint(name) is None:
            return Problem("not-found", f"no feed {name!r}")
        try:
            held, open_holds, following = await self._store.receipts.holds(name, limit, after)
        except BadCursor as exc:
            return Problem("validation-error", f"after: {exc}")
        return HoldPage([_hold(r) for r in held], open_holds, following)

    async def _checkpoint(self, name: str) -> Checkpoint | None:
        return {c.name: c for c in await self._store.checkpoints.all()}.get(name)

    async def decide(
        self, admin: Principal, name: str, event_id: str, body: HoldAction
    ) -> HoldDecided | Problem:
        """``quarantine``: a final disposition (the barrier may pass the event); ``retry``:
        the stored event is decided again now, as the observer would (the operation known
        now settles it; a signature that verifies now lets it through); the hold is never
        deleted, and stays held when the decision is to hold."""
        if not admin.all_tenants:
            return _forbidden()
        if not FEED_NAME.match(name) or "\x00" in event_id:
            return Problem("not-found", f"no held event on feed {name[:64]!r}")
        held = await self._store.receipts.receipt(name, event_id)
        if held is None or held.state != "held":
            return Problem("not-found", f"no held event {event_id!r} on feed {name!r}")
        if body.action == "retry":
            state = await self._events.redecide(name, held, operator=True)
            return HoldDecided(feed=name, event_id=event_id, action="retry", state=state.value)
        decided = await self._store.receipts.refuse_event(
            name,
            event_id,
            held.event_order,
            held.operation_id,
            None,
            "quarantined",
            "operator-quarantine",
            datetime.fromtimestamp(self._clock(), UTC),
        )
        return HoldDecided(feed=name, event_id=event_id, action="quarantine", state=decided.state)

    async def accept_conflict(
        self, admin: Principal, name: str, event_id: str, body: ConflictAction
    ) -> ConflictAccepted | Problem:
        """After review, take the feed's account of an event whose identity conflicted with
        the receipts: the receipts involved are unpinned (outcomes stay), so the page that
        stopped the feed passes; the alarm stays as ``conflict-accepted``. An event twice in
        one page is refused (``conflict-in-one-page``) and nothing changes: no receipt holds
        it against the feed, only the source serving the page in order resumes it."""
        if not admin.all_tenants:
            return _forbidden()
        if not FEED_NAME.match(name) or "\x00" in event_id:
            return Problem("not-found", f"no conflicting identity on feed {name[:64]!r}")
        accepted = await self._store.alarms.accept_conflict(
            name, event_id, datetime.fromtimestamp(self._clock(), UTC)
        )
        if accepted is None:
            return Problem("not-found", f"no conflicting identity {event_id!r} on feed {name!r}")
        if isinstance(accepted, InOnePage):
            return Problem(
                "conflict-in-one-page",
                f"event {event_id!r} was served twice in one page of feed {name!r}: no "
                "operator can accept that; the feed resumes once the source serves the page "
                "in order",
            )
        log.warning(
            "feed conflicting identity accepted by an operator",
            extra={
                "feed": name,
                "event_id": event_id,
                "admin": str(admin.id),
                "unpinned": accepted.unpinned,
                "action": body.action,
            },
        )
        return ConflictAccepted(feed=name, event_id=event_id, unpinned=accepted.unpinned)

    async def _view(self, name: str, checkpoint: Checkpoint | None) -> FeedView:
        spec = self._specs.get(name)
        kind = checkpoint.kind if checkpoint is not None else spec.kind if spec else "cursor"
        holds, open_holds, _ = await self._store.receipts.holds(name)
        view = FeedView(
            name=name,
            kind=kind,
            configured=spec is not None,
            promises=sorted(spec.promises) if spec is not None else [],
            checkpoint_version=0 if checkpoint is None else checkpoint.version,
            lag=None,
            oldest_unknown=await self._store.checkpoints.oldest_unknown(self._external),
            holds=[_hold(r) for r in holds],
            open_holds=open_holds,
            alarms=[_alarm(a) for a in await self._store.alarms.recent(name)],
        )
        if checkpoint is not None:
            if kind == "cursor":
                view.resume_cursor = checkpoint.resume_cursor
                view.applied_position = checkpoint.applied_position
            else:
                view.closed_through_timestamp = checkpoint.closed_through_timestamp
            if checkpoint.caught_up_at is not None:
                view.lag = max(0.0, self._clock() - checkpoint.caught_up_at.timestamp())
        return view


def _forbidden() -> Problem:
    return Problem("forbidden", "feeds span tenants: only an all-tenant admin may see them")


def _hold(receipt: Receipt) -> HoldView:
    return HoldView(
        event_id=receipt.event_id,
        order=receipt.event_order,
        operation_id=None if receipt.operation_id is None else str(receipt.operation_id),
        reason=receipt.reason,
        first_seen_at=receipt.first_seen_at,
        age=round(receipt.age, 3),
        kept=receipt.evidence is not None,
    )


def _alarm(alarm: Alarm) -> AlarmView:
    return AlarmView(
        kind=alarm.kind,
        event_id=alarm.event_id,
        detail=alarm.detail,
        count=alarm.count,
        first_at=alarm.first_at,
        last_at=alarm.last_at,
    )
