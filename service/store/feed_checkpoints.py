"""A feed's progress (docs/design.md §8): its checkpoint, and the lag its source cannot fake.

A checkpoint moves only by a CAS on its version and the value it was read with
(:meth:`FeedCheckpoints.promote_cursor`, :meth:`FeedCheckpoints.close_through`); a losing
observer rereads, and never writes older progress over newer. A
:class:`service.store.feeds.FeedStore` holds one as its ``checkpoints``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.db import reader
from service.store.feed_tables import feed_checkpoints, feed_promotions
from service.store.tables import inline, operations

__all__ = ["Checkpoint", "FeedCheckpoints"]


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
    promoted_cursor: str | None = None
    """the cursor a page was last promoted to ('' the feed's start); an empty page's adopted
    token never moves it (None: a row written before migration 0013)"""

    @property
    def start_cursor(self) -> str:
        """Where an observer starting at this checkpoint marks its start (the base of its
        first reconciliation passes): the cursor a page was last promoted to, never a token
        adopted from an empty page, which may skip events the source broke its promise on.
        A row written before migration 0013 has none: its ``resume_cursor`` stands in."""
        return self.resume_cursor if self.promoted_cursor is None else self.promoted_cursor


class FeedCheckpoints:
    """Checkpoints: created, read, moved by CAS; and the age of the oldest ``unknown``."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._reader = reader(engine)

    async def checkpoint(self, name: str, kind: str) -> Checkpoint:
        """The feed's checkpoint, created at the start of the feed if it has none."""
        async with self._engine.begin() as conn:
            await conn.execute(
                pg_insert(feed_checkpoints)
                .values(name=name, kind=kind, promoted_cursor="")
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

    async def all(self) -> list[Checkpoint]:
        """Every feed's checkpoint, by name."""
        async with self._reader.connect() as conn:
            rows = (
                await conn.execute(select(feed_checkpoints).order_by(feed_checkpoints.c.name))
            ).mappings()
            return [Checkpoint(**dict(row)) for row in rows]

    async def promote_cursor(
        self, current: Checkpoint, cursor: str, applied_position: int | None, now: datetime
    ) -> bool:
        """Move a cursor feed's checkpoint, if nobody moved it since ``current`` was read;
        ``cursor`` is also the one a page was last promoted to (:attr:`Checkpoint.start_cursor`).
        The move that wins notes, in the same statement, that the checkpoint passed
        ``applied_position`` at ``now`` (``feed_promotions``; the first such note of a position
        stands): the retention purge takes a receipt only once it was passed that long ago."""
        return await self._cas(
            current,
            new_version=True,
            note_promotion=True,
            updated_at=now,
            resume_cursor=cursor,
            promoted_cursor=cursor,
            applied_position=applied_position,
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
        return await self._cas(
            current, new_version=True, updated_at=now, closed_through_timestamp=timestamp
        )

    async def advance_cursor(self, current: Checkpoint, cursor: str, now: datetime) -> bool:
        """An empty page's new cursor: kept (if nobody moved the checkpoint since
        ``current``), without a new version (nothing was passed), and the feed noted caught
        up, in one statement. The cursor a page was last promoted to stays: the token may
        skip events, and no observer starts its passes from it."""
        return await self._cas(current, new_version=False, resume_cursor=cursor, caught_up_at=now)

    async def _cas(
        self, current: Checkpoint, *, new_version: bool, note_promotion: bool = False, **values: Any
    ) -> bool:
        """Write ``values`` if the checkpoint is still as ``current`` read it (its version,
        cursor and closed timestamp); ``new_version``: a position was passed;
        ``note_promotion``: a row written moves a cursor feed's applied position, noted in
        ``feed_promotions`` by the same statement (one with a common table expression)."""
        c = feed_checkpoints.c
        if new_version:
            values["version"] = c.version + 1
        move = (
            update(feed_checkpoints)
            .where(
                c.name == current.name,
                c.version == current.version,
                c.resume_cursor == current.resume_cursor,
                c.closed_through_timestamp.is_not_distinct_from(current.closed_through_timestamp),
            )
            .values(**values)
        )
        async with self._engine.begin() as conn:
            if not note_promotion:
                return (await conn.execute(move)).rowcount == 1
            won = move.returning(c.name, c.applied_position, c.updated_at).cte("won")
            noted = (
                pg_insert(feed_promotions)
                .from_select(
                    ["feed", "applied_position", "promoted_at"],
                    select(won.c.name, won.c.applied_position, won.c.updated_at).where(
                        won.c.applied_position.is_not(None)
                    ),
                )
                .on_conflict_do_nothing(index_elements=["feed", "applied_position"])
                .cte("noted")
            )
            moved = await conn.scalar(select(func.count()).select_from(won).add_cte(noted))
        return moved == 1

    async def caught_up(self, name: str, now: datetime) -> None:
        """Note that a page came back with nothing new (for the lag shown to operators)."""
        async with self._engine.begin() as conn:
            await conn.execute(
                update(feed_checkpoints)
                .where(feed_checkpoints.c.name == name)
                .values(caught_up_at=now)
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
                select(func.extract("epoch", func.clock_timestamp() - func.min(o.updated_at)))
                .prefix_with(
                    "/* spans tenants: a provider's feeds settle every tenant's operations;"
                    " the oldest unknown one of any tenant is theirs to catch up (a read) */"
                )
                .where(o.state == inline("unknown"), o.route.in_(list(routes)))
            )
        return None if age is None else max(0.0, float(age))
