"""The feed observer's durable state (DESIGN §8): checkpoints, receipts, alarms.

* Every event's outcome commits with its receipt in one transaction
  (:meth:`FeedStore.settle_event`, :meth:`FeedStore.refuse_event`): the receipt row is
  inserted first, so a second observer on the same event waits on it and then finds it.
* A hold is a durable receipt in state ``held``: not final. It keeps the event as served
  (evidence and signature) until it is final, so it can be decided again on its own
  (:meth:`FeedStore.due_holds`); its age is on the database's clock, whichever observer
  first saw it.
* A checkpoint moves only by a CAS on its version and the value it was read with
  (:meth:`FeedStore.promote_cursor`, :meth:`FeedStore.close_through`); a losing observer
  rereads, and never writes older progress over newer.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core import Observation
from service.core.feed import ReceiptState, Seen
from service.store import keyset
from service.store.outcomes import Settled
from service.store.phase import Phase, PhaseRunner
from service.store.tables import feed_alarms, feed_checkpoints, feed_receipts, operations
from service.store.unit_of_work import UnitOfWork

__all__ = ["Alarm", "Checkpoint", "FeedStore", "Receipt"]


class Checkpoint(msgspec.Struct, frozen=True):
    name: str
    kind: str
    resume_cursor: str
    applied_position: int | None
    closed_through_timestamp: int | None
    version: int
    updated_at: datetime
    caught_up_at: datetime | None
    walk_cursor: str | None = None
    """where a cursor feed's reconciliation pass reads next (None: a new pass)"""
    walk_after: int | None = None
    """where a timestamp feed's audit walk reads next (None: a new walk; -1: the start)"""


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
    """False once an operator accepted a conflicting identity of its event"""
    age: float = 0.0
    """seconds since the event was first seen, on the database's clock"""


class Alarm(msgspec.Struct, frozen=True):
    feed: str
    kind: str
    event_id: str
    detail: str
    count: int
    first_at: datetime
    last_at: datetime
    event_order: int | None = None
    """where the page served the event (conflicting identities)"""


class Accepted(msgspec.Struct, frozen=True):
    """What accepting a conflicting identity did: the receipts it unpinned."""

    unpinned: list[str]


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


class FeedStore:
    def __init__(
        self,
        engine: AsyncEngine,
        runner: PhaseRunner,
        *,
        settle: SettlePhase,
    ) -> None:
        """``settle``: builds the settle phase of an observation (the settlement store's own
        policy, clock and retention), so an event's settlement and its receipt share one
        transaction."""
        self._engine = engine
        self._reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._runner = runner
        self._settle = settle

    # -- checkpoints --------------------------------------------------------------------------

    async def checkpoint(self, name: str, kind: str) -> Checkpoint:
        """The feed's checkpoint, created at the start of the feed if it has none."""
        async with self._engine.begin() as conn:
            await conn.execute(
                pg_insert(feed_checkpoints)
                .values(name=name, kind=kind)
                .on_conflict_do_nothing(index_elements=["name"])
            )
            row = (
                (
                    await conn.execute(
                        select(feed_checkpoints).where(feed_checkpoints.c.name == name)
                    )
                )
                .mappings()
                .one()
            )
        found = Checkpoint(**dict(row))
        if found.kind != kind:
            raise ValueError(f"feed {name} is a {found.kind} feed, not {kind}")
        return found

    async def checkpoints(self) -> list[Checkpoint]:
        async with self._reader.connect() as conn:
            rows = (
                await conn.execute(select(feed_checkpoints).order_by(feed_checkpoints.c.name))
            ).mappings()
            return [Checkpoint(**dict(row)) for row in rows]

    async def promote_cursor(
        self, current: Checkpoint, cursor: str, applied_position: int | None, now: datetime
    ) -> bool:
        """Move a cursor feed's checkpoint, if nobody moved it since ``current`` was read."""
        return await self._cas(
            current, now, resume_cursor=cursor, applied_position=applied_position
        )

    async def walk_to(self, name: str, *, cursor: str | None, after: int | None) -> None:
        """Where the feed's walk behind its checkpoint reads next (None: a new walk). A
        progress marker every observer of the feed shares: no version, no CAS."""
        c = feed_checkpoints.c
        async with self._engine.begin() as conn:
            await conn.execute(
                update(feed_checkpoints)
                .where(c.name == name)
                .values(walk_cursor=cursor, walk_after=after)
            )

    async def close_through(self, current: Checkpoint, timestamp: int, now: datetime) -> bool:
        """Move a timestamp feed's checkpoint, if nobody moved it since ``current``."""
        return await self._cas(current, now, closed_through_timestamp=timestamp)

    async def _cas(self, current: Checkpoint, now: datetime, **values: Any) -> bool:
        c = feed_checkpoints.c
        async with self._engine.begin() as conn:
            moved = await conn.execute(
                update(feed_checkpoints)
                .where(
                    c.name == current.name,
                    c.version == current.version,
                    c.resume_cursor == current.resume_cursor,
                    c.closed_through_timestamp.is_not_distinct_from(
                        current.closed_through_timestamp
                    ),
                )
                .values(version=c.version + 1, updated_at=now, **values)
            )
        return moved.rowcount == 1

    async def advance_cursor(self, current: Checkpoint, cursor: str, now: datetime) -> bool:
        """An empty page's new cursor: kept (if nobody moved the checkpoint since
        ``current``), without a new version (nothing was passed), and the feed noted caught
        up, in one statement."""
        c = feed_checkpoints.c
        async with self._engine.begin() as conn:
            moved = await conn.execute(
                update(feed_checkpoints)
                .where(
                    c.name == current.name,
                    c.version == current.version,
                    c.resume_cursor == current.resume_cursor,
                )
                .values(resume_cursor=cursor, caught_up_at=now)
            )
        return moved.rowcount == 1

    async def caught_up(self, name: str, now: datetime) -> None:
        """Note that a page came back with nothing new (for the lag shown to operators)."""
        async with self._engine.begin() as conn:
            await conn.execute(
                update(feed_checkpoints)
                .where(feed_checkpoints.c.name == name)
                .values(caught_up_at=now)
            )

    # -- receipts -----------------------------------------------------------------------------

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
        stmt = select(*_WITH_AGE).where(r.feed == feed, r.state == "held")
        if after is not None:
            seen, event_id = keyset.decode(after)
            stmt = stmt.where(keyset.after(r.first_seen_at, r.event_id, seen, event_id))
        async with self._reader.connect() as conn:
            rows = (
                await conn.execute(stmt.order_by(r.first_seen_at, r.event_id).limit(limit + 1))
            ).mappings()
            shown = [_receipt(row) for row in rows]
            total = await conn.scalar(select(func.count()).where(r.feed == feed, r.state == "held"))
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
                        r.state == "held",
                        r.reason != "bad-signature",
                        r.evidence.is_not(None),  # one that kept no event waits for its feed
                    )
                    .order_by(r.decided_at, r.event_id)
                    .limit(limit)
                )
            ).mappings()
            return [_receipt(row) for row in rows]

    async def counts(self) -> dict[tuple[str, str], int]:
        """(feed, state) -> receipts: what the metrics show, the same from every process."""
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
                observation_id = await uow.record_observation(
                    operation_id,
                    observation,
                    stage="A",
                    disposition="quarantined",
                    reason=reason,
                    revision_before=None,
                    revision_after=None,
                    detail={"feed": feed, "event_id": event_id, "receipt": state},
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

    async def oldest_unknown(self, routes: Sequence[str]) -> float | None:
        """Seconds (the database's clock) since the longest-``unknown`` operation of
        ``routes`` became unknown: what the feeds exist to settle, which a feed's own pages
        cannot fake. None when there is none."""
        if not routes:
            return None
        o = operations.c
        async with self._reader.connect() as conn:
            age = await conn.scalar(
                select(
                    func.extract("epoch", func.clock_timestamp() - func.min(o.updated_at))
                ).where(o.state == "unknown", o.route.in_(list(routes)))
            )
        return None if age is None else max(0.0, float(age))

    # -- alarms -------------------------------------------------------------------------------

    async def alarm(
        self,
        feed: str,
        kind: str,
        event_id: str,
        detail: str,
        now: datetime,
        order: int | None = None,
    ) -> None:
        """Raise (or repeat) an alarm: one row per (feed, kind, event), counted; ``order``:
        where the page served the event."""
        async with self._engine.begin() as conn:
            await conn.execute(_raise(feed, kind, event_id, detail, now, order))

    async def accept_conflict(self, feed: str, event_id: str, now: datetime) -> Accepted | None:
        """An operator accepts the conflicting identity alarmed for ``event_id`` after review,
        in one transaction: the event's receipt is unpinned, and on a cursor feed so is the
        receipt holding the place the page served it at; the alarm becomes a
        ``conflict-accepted`` alarm (the trail). None: no such alarm."""
        a, r = feed_alarms.c, feed_receipts.c
        async with self._engine.begin() as conn:
            alarm = (
                await conn.execute(
                    delete(feed_alarms)
                    .where(a.feed == feed, a.kind == "conflicting-identity", a.event_id == event_id)
                    .returning(a.detail, a.event_order)
                )
            ).first()
            if alarm is None:
                return None
            kind = (
                await conn.execute(
                    select(feed_checkpoints.c.kind).where(feed_checkpoints.c.name == feed)
                )
            ).scalar_one_or_none()
            involved = r.event_id == event_id
            if kind == "cursor" and alarm.event_order is not None:
                involved = or_(involved, r.event_order == alarm.event_order)
            unpinned = (
                await conn.execute(
                    update(feed_receipts)
                    .where(r.feed == feed, involved, r.pinned)
                    .values(pinned=False)
                    .returning(r.event_id)
                )
            ).scalars()
            accepted = Accepted(sorted(unpinned))
            detail = f"accepted by an operator; unpinned {accepted.unpinned}: {alarm.detail}"
            await conn.execute(
                _raise(feed, "conflict-accepted", event_id, detail, now, alarm.event_order)
            )
        return accepted

    async def alarms(self, feed: str | None = None) -> list[Alarm]:
        a = feed_alarms.c
        stmt = select(feed_alarms).order_by(a.last_at.desc()).limit(100)
        if feed is not None:
            stmt = stmt.where(a.feed == feed)
        async with self._reader.connect() as conn:
            return [Alarm(**dict(row)) for row in (await conn.execute(stmt)).mappings()]

    async def alarm_counts(self) -> dict[tuple[str, str], int]:
        a = feed_alarms.c
        async with self._reader.connect() as conn:
            rows = await conn.execute(
                select(a.feed, a.kind, func.sum(a.count)).group_by(a.feed, a.kind)
            )
            return {(row[0], row[1]): int(row[2]) for row in rows}


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


def _raise(
    feed: str, kind: str, event_id: str, detail: str, now: datetime, order: int | None
) -> Any:
    a = feed_alarms.c
    statement = pg_insert(feed_alarms).values(
        feed=feed,
        kind=kind,
        event_id=event_id,
        detail=detail[:1000],
        first_at=now,
        last_at=now,
        event_order=order,
    )
    return statement.on_conflict_do_update(
        index_elements=[a.feed, a.kind, a.event_id],
        set_={
            "count": a.count + 1,
            "last_at": now,
            "detail": statement.excluded.detail,
            "event_order": statement.excluded.event_order,
        },
    )
