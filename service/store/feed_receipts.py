"""A feed's receipts (docs/design.md §8): one per event, what became of it, and the open holds.

* Every event's outcome commits with its receipt in one transaction
  (:meth:`FeedReceipts.settle_event`, :meth:`FeedReceipts.refuse_event`): the receipt row
  is inserted first, so a second observer on the same event waits on it and then finds it.
* A hold is a durable receipt in state ``held``: not final. It keeps the event as served
  (evidence and signature) until it is final, so it can be decided again on its own
  (:meth:`FeedReceipts.due_holds`); its age is on the database's clock, whichever observer
  first saw it.

A :class:`service.store.feeds.FeedStore` holds one as its ``receipts``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import and_, exists, false, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core import Observation
from service.core.feed import FeedEvent, ReceiptState, Seen
from service.store import keyset
from service.store.db import reader
from service.store.feed_tables import feed_checkpoints, feed_receipts
from service.store.outcomes import Settled
from service.store.phase import Phase, PhaseRunner
from service.store.tables import inline
from service.store.unit_of_work import UnitOfWork, observer_tenant

__all__ = ["FeedReceipts", "Receipt", "SettlePhase"]


class Receipt(msgspec.Struct, frozen=True):
    feed: str
    event_id: str
    event_order: int
    operation_id: uuid.UUID | None
    state: str
    reason: str
    observation_id: int | None
    digest: str
    first_seen_at: datetime
    decided_at: datetime
    evidence: bytes | None = None
    """the event's evidence as served, kept while the receipt is held"""
    signature: str | None = None
    pinned: bool = True
    """False once an operator accepted a conflicting identity of its event, until a page that
    passes serves the event again (:meth:`FeedReceipts.repin`)"""
    age: float = 0.0
    """seconds since the event was first seen, on the database's clock"""


# (operation, observation, detail) -> the phase that settles it under the row lock; the phase
# returns None when there is no such operation
SettlePhase = Callable[[uuid.UUID, Observation, dict[str, Any]], Phase[tuple[Any, Settled] | None]]


def _receipt(row: Any) -> Receipt:
    values = dict(row)
    if values.get("evidence") is not None:
        values["evidence"] = bytes(values["evidence"])
    if values.get("age") is not None:
        values["age"] = float(values["age"])  # numeric from extract()
    return Receipt(**values)


# every column of a receipt, and its age on the database's clock
_WITH_AGE = (
    *feed_receipts.c,
    func.extract("epoch", func.clock_timestamp() - feed_receipts.c.first_seen_at).label("age"),
)


# Open holds an admin view lists (oldest first); the view also says how many there are.
HOLDS_SHOWN = 100


class FeedReceipts:
    """Receipts: read by event, by place and by state; written with the event's outcome."""

    def __init__(self, engine: AsyncEngine, runner: PhaseRunner, *, settle: SettlePhase) -> None:
        """``runner``: runs an event's transaction (the settlement store's, one retry
        policy); ``settle``: builds the settle phase of the event's observation, which
        commits with its receipt."""
        self._engine = engine
        self._reader = reader(engine)
        self._runner = runner
        self._settle = settle

    async def seen(self, feed: str, event_ids: Sequence[str]) -> dict[str, Seen]:
        """Receipts of ``event_ids``: where each event was, and its state."""
        if not event_ids:
            return {}
        r = feed_receipts.c
        async with self._reader.connect() as conn:
            rows = await conn.execute(
                select(r.event_id, r.event_order, r.state, r.digest, r.pinned).where(
                    r.feed == feed, r.event_id.in_(list(event_ids))
                )
            )
            return {
                row.event_id: Seen(
                    order=row.event_order,
                    state=ReceiptState(row.state),
                    digest=row.digest,
                    pinned=row.pinned,
                )
                for row in rows
            }

    async def owners(self, feed: str, orders: Sequence[int]) -> dict[int, str]:
        """The event id holding a receipt at each of ``orders`` (cursor positions); an
        unpinned receipt holds no place."""
        if not orders:
            return {}
        r = feed_receipts.c
        async with self._reader.connect() as conn:
            rows = await conn.execute(
                select(r.event_order, r.event_id).where(
                    r.feed == feed, r.event_order.in_(list(orders)), r.pinned
                )
            )
            return {row.event_order: row.event_id for row in rows}

    async def repin(self, feed: str, served: Sequence[FeedEvent], *, places: bool) -> list[str]:
        """Pin again, in one transaction, the unpinned receipts of ``served`` at the place
        and content a page that passed the checks served them with (the checks' ``repin``);
        the event ids pinned again. Only a receipt still unpinned is written: an observer
        that read an older page and lost the race to one that pinned it since changes
        nothing. ``places`` (cursor feeds, where a position is one event's): a receipt is
        not pinned at a place another pinned receipt has taken meanwhile; it stays unpinned
        until the feed serves it again. Re-pinnings of one cursor feed take turns on its
        checkpoint's row, so each sees the pins the one before it committed."""
        r = feed_receipts.c
        other = feed_receipts.alias("other")
        pinned: list[str] = []
        if not served:
            return pinned
        async with self._engine.begin() as conn:
            if places:
                c = feed_checkpoints.c
                await conn.execute(select(c.name).where(c.name == feed).with_for_update())
            for event in served:
                stmt = update(feed_receipts).where(
                    r.feed == feed, r.event_id == event.event_id, r.pinned == false()
                )
                if places:
                    stmt = stmt.where(
                        ~exists().where(
                            other.c.feed == feed,
                            other.c.event_order == event.order,
                            other.c.pinned,
                            other.c.event_id != event.event_id,
                        )
                    )
                written = await conn.execute(
                    stmt.values(
                        pinned=True, event_order=event.order, digest=event.digest
                    ).returning(r.event_id)
                )
                pinned.extend(written.scalars())
        return pinned

    async def receipt(self, feed: str, event_id: str) -> Receipt | None:
        r = feed_receipts.c
        async with self._reader.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(*_WITH_AGE).where(r.feed == feed, r.event_id == event_id)
                    )
                )
                .mappings()
                .first()
            )
        return None if row is None else _receipt(row)

    async def holds(
        self, feed: str, limit: int = HOLDS_SHOWN, after: str | None = None
    ) -> tuple[list[Receipt], int, str | None]:
        """The feed's open holds, oldest first (at most ``limit``, strictly after the keyset
        cursor ``after``: BadCursor when it is not one), how many there are in all, and the
        cursor of the next page (None: this is the last)."""
        r = feed_receipts.c
        stmt = select(*_WITH_AGE).where(r.feed == feed, r.state == inline("held"))
        if after is not None:
            seen, event_id = keyset.decode(after)
            stmt = stmt.where(keyset.after(r.first_seen_at, r.event_id, seen, event_id))
        async with self._reader.connect() as conn:
            rows = (
                await conn.execute(stmt.order_by(r.first_seen_at, r.event_id).limit(limit + 1))
            ).mappings()
            shown = [_receipt(row) for row in rows]
            total = await conn.scalar(
                select(func.count()).where(r.feed == feed, r.state == inline("held"))
            )
        last = shown[limit - 1] if len(shown) > limit else None
        following = None if last is None else keyset.encode(last.first_seen_at, last.event_id)
        return shown[:limit], int(total or 0), following

    async def due_holds(self, feed: str, limit: int) -> list[Receipt]:
        """Holds to decide again on their own: those waiting for an operation (not those
        waiting for an operator), the least recently decided first."""
        r = feed_receipts.c
        async with self._reader.connect() as conn:
            rows = (
                await conn.execute(
                    select(*_WITH_AGE)
                    .where(
                        r.feed == feed,
                        r.state == inline("held"),
                        r.reason != "bad-signature",
                        r.evidence.is_not(None),  # one that kept no event waits for its feed
                    )
                    .order_by(r.decided_at, r.event_id)
                    .limit(limit)
                )
            ).mappings()
            return [_receipt(row) for row in rows]

    async def counts(self) -> dict[tuple[str, str], int]:
        """(feed, state) -> receipts: what the metrics show, the same from every process. A
        whole-table count: only the feed figures' background reader runs it, on a connection
        of its own (service.app.feed_figures), never a request or a scrape."""
        r = feed_receipts.c
        async with self._reader.connect() as conn:
            rows = await conn.execute(
                select(r.feed, r.state, func.count()).group_by(r.feed, r.state)
            )
            return {(row[0], row[1]): int(row[2]) for row in rows}

    async def settle_event(
        self,
        feed: str,
        event_id: str,
        order: int,
        operation_id: uuid.UUID,
        observation: Observation,
        now: datetime,
        *,
        digest: str = "",
        served: tuple[bytes, str] | None = None,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Receipt, tuple[Any, Settled] | None]:
        """Settle the event's observation and write its receipt, in one transaction (final,
        or a hold when the operation's row went meanwhile);
        returns the receipt and what the settle phase returned (the row before, the
        settlement), None when nothing was settled. An event that already has a final receipt
        is left alone (returned as it is). ``served``: the event as served, which the receipt
        keeps should it be a hold (the operation's row went meanwhile)."""

        async def phase(uow: UnitOfWork) -> tuple[Receipt, tuple[Any, Settled] | None]:
            existing = await _claim_receipt(uow.connection, feed, event_id, order, now)
            if existing is not None and ReceiptState(existing.state).final:
                return existing, None
            detail = {"feed": feed, "event_id": event_id}
            found = await self._settle(operation_id, observation, detail)(uow)
            kept = None
            if found is None:  # the row went between the caller's read and this transaction
                state, reason, observation_id, kept = "held", "unknown-operation", None, served
            else:
                settled = found[1]
                disposition = settled.decision.disposition.value
                state = _RECEIPT_OF.get(disposition, "applied")
                reason, observation_id = settled.decision.reason.value, settled.observation_id
            receipt = await _write_receipt(
                uow.connection, feed, event_id, operation_id, state, reason, observation_id, now,
                digest, served=kept,
            )  # fmt: skip
            return receipt, found

        return await self._runner.run(
            f"feed {feed} event {event_id}", phase, before_commit=before_commit
        )

    async def refuse_event(
        self,
        feed: str,
        event_id: str,
        order: int,
        operation_id: uuid.UUID | None,
        observation: Observation | None,
        state: str,
        reason: str,
        now: datetime,
        *,
        digest: str = "",
        served: tuple[bytes, str] | None = None,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> Receipt:
        """A receipt in ``state`` (quarantined: final; held: not) with the refused observation
        recorded (stage A, quarantined), in one transaction. A final receipt already there is
        kept. ``served``: the event's evidence and signature, which a hold keeps (a hold
        without them keeps what it had)."""

        async def phase(uow: UnitOfWork) -> Receipt:
            existing = await _claim_receipt(uow.connection, feed, event_id, order, now)
            if existing is not None and ReceiptState(existing.state).final:
                return existing
            observation_id = None
            if observation is not None and operation_id is not None:
                # a provider's feed spans tenants: the operation's is found by its id (the
                # marked lookup); an operation not here: the observer's rule (no principal
                # in a feed's detail: '')
                detail = {"feed": feed, "event_id": event_id, "receipt": state}
                tenant = await uow.pinned(operation_id)
                observation_id = await uow.record_observation(
                    operation_id,
                    observation,
                    stage="A",
                    disposition="quarantined",
                    reason=reason,
                    revision_before=None,
                    revision_after=None,
                    detail=detail,
                    tenant=observer_tenant(detail) if tenant is None else tenant,
                )
            kept = served
            if kept is None and existing is not None and existing.evidence is not None:
                kept = (existing.evidence, existing.signature or "")
            return await _write_receipt(
                uow.connection, feed, event_id, operation_id, state, reason, observation_id, now,
                digest or (existing.digest if existing is not None else ""),
                served=kept if state == "held" else None,
            )  # fmt: skip

        return await self._runner.run(
            f"feed {feed} refuse {event_id}", phase, before_commit=before_commit
        )


# the core's disposition of a feed event -> its receipt's state: an event that only confirms
# what the row already says (strengthened: same outcome, same digest) is a replay, ignored
_RECEIPT_OF = {
    "applied": "applied",
    "strengthened": "ignored",
    "conflict": "applied",
    "ignored": "ignored",
    "quarantined": "quarantined",
}


async def _claim_receipt(
    conn: AsyncConnection, feed: str, event_id: str, order: int, now: datetime
) -> Receipt | None:
    """Insert the event's receipt as a hold (the row this transaction will finish), or lock
    and return the one already there. A concurrent observer of the same event waits here
    until the first one commits."""
    r = feed_receipts.c
    inserted = await conn.execute(
        pg_insert(feed_receipts)
        .values(
            feed=feed,
            event_id=event_id,
            event_order=order,
            state="held",
            reason="processing",
            first_seen_at=func.now(),  # the database's clock: every observer ages it alike
            decided_at=now,
        )
        .on_conflict_do_nothing(index_elements=["feed", "event_id"])
        .returning(r.event_id)
    )
    if inserted.first() is not None:
        return None
    row = (
        (
            await conn.execute(
                select(*_WITH_AGE).where(r.feed == feed, r.event_id == event_id).with_for_update()
            )
        )
        .mappings()
        .one()
    )
    return _receipt(row)


async def _write_receipt(
    conn: AsyncConnection,
    feed: str,
    event_id: str,
    operation_id: uuid.UUID | None,
    state: str,
    reason: str,
    observation_id: int | None,
    now: datetime,
    digest: str,
    *,
    served: tuple[bytes, str] | None = None,
) -> Receipt:
    """Finish the event's receipt; ``served`` (kept by a hold) or nothing (a final one)."""
    r = feed_receipts.c
    evidence, signature = served if served is not None else (None, None)
    row = (
        (
            await conn.execute(
                update(feed_receipts)
                .where(and_(r.feed == feed, r.event_id == event_id))
                .values(
                    operation_id=operation_id,
                    state=state,
                    reason=reason[:64],
                    observation_id=observation_id,
                    digest=digest,
                    decided_at=now,
                    evidence=evidence,
                    signature=signature,
                )
                .returning(*_WITH_AGE)
            )
        )
        .mappings()
        .one()
    )
    return _receipt(row)
