"""A feed's alarms (docs/design.md §8): what an operator must look at, counted per event, and
accepting a conflicting identity after review. A :class:`service.store.feeds.FeedStore`
holds one as its ``alarms``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core.feed import twice_in_one_page
from service.store.db import reader
from service.store.feed_tables import feed_alarms, feed_checkpoints, feed_receipts

__all__ = ["Accepted", "Alarm", "FeedAlarms", "InOnePage"]


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


class InOnePage(msgspec.Struct, frozen=True):
    """Accepting refused: the conflicting identity is an event twice in one page, which no
    receipt holds against the feed; only the source serving the page in order resumes it."""


class FeedAlarms:
    """Alarms: raised (or repeated), listed, counted; a conflicting identity accepted."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._reader = reader(engine)

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

    async def accept_conflict(
        self, feed: str, event_id: str, now: datetime
    ) -> Accepted | InOnePage | None:
        """An operator accepts the conflicting identity alarmed for ``event_id`` after review,
        in one transaction: the event's receipt is unpinned, and on a cursor feed so is the
        receipt holding the place the page served it at; the alarm becomes a
        ``conflict-accepted`` alarm (the trail). None: no such alarm. :class:`InOnePage`: the
        alarm is for the event twice in one page, which unpinning cannot let pass; nothing
        is written (the alarm and the receipts stay as they are)."""
        a, r = feed_alarms.c, feed_receipts.c
        this = (a.feed == feed, a.kind == "conflicting-identity", a.event_id == event_id)
        async with self._engine.begin() as conn:
            alarm = (
                await conn.execute(select(a.detail, a.event_order).where(*this).with_for_update())
            ).first()
            if alarm is None:
                return None
            if twice_in_one_page(alarm.detail):
                return InOnePage()
            await conn.execute(delete(feed_alarms).where(*this))
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

    async def recent(self, feed: str | None = None) -> list[Alarm]:
        """The 100 alarms (of ``feed``, or of every feed) raised or repeated last, newest
        first."""
        a = feed_alarms.c
        stmt = select(feed_alarms).order_by(a.last_at.desc()).limit(100)
        if feed is not None:
            stmt = stmt.where(a.feed == feed)
        async with self._reader.connect() as conn:
            return [Alarm(**dict(row)) for row in (await conn.execute(stmt)).mappings()]

    async def counts(self) -> dict[tuple[str, str], int]:
        """(feed, kind) -> how many times alarms of that kind were raised."""
        a = feed_alarms.c
        async with self._reader.connect() as conn:
            rows = await conn.execute(
                select(a.feed, a.kind, func.sum(a.count)).group_by(a.feed, a.kind)
            )
            return {(row[0], row[1]): int(row[2]) for row in rows}


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
