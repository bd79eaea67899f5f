"""Reading the feeds during a reliability run and at its end, against the rules of
:mod:`tests.reliability.feed_rules`.

A reading takes the provider's payments first (its SQLite file), then each checkpoint, then
the receipts (read after the checkpoints, so a receipt a checkpoint relied on is there).
:class:`FeedWatch` reads every few seconds during the run and applies the holds and passed
rules; :func:`final_check` reads until the observers have caught up (bounded), then applies
all four.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from service.store.db import async_url
from tests.reliability.feed_rules import (
    Checkpoint,
    Event,
    Receipt,
    Snapshot,
    Violation,
    final_violations,
    sample_violations,
)

__all__ = ["FeedWatch", "FinalCheck", "final_check", "provider_events", "snapshot"]

T = TypeVar("T")

# The simulator's backfill fault pays this beneficiary (devstack/provider/feeds.py).
BACKFILL_BENEFICIARY = "FEED BACKFILL"
# How often the watch samples the feeds during the run: often enough to see a hold outstay
# its limit (seconds long) while it does, rarely enough to cost nothing beside the load.
SAMPLE_EVERY = 2.0
# A sample is given up after this long (PostgreSQL may be restarting or cut off by the nemesis).
READ_TIMEOUT = 5.0
# After the load: how long the observers get to give every event its final receipt.
CATCH_UP_PATIENCE = 60.0
CATCH_UP_POLL = 0.5


def provider_events(db_path: Path) -> list[Event]:
    """Every payment the simulator committed (devstack/provider/store.py), as an event."""
    with contextlib.closing(sqlite3.connect(db_path, timeout=5)) as conn:
        rows = conn.execute(
            "SELECT rowid, reference, position, timestamp, request FROM payments ORDER BY rowid"
        ).fetchall()
    return [
        Event(
            event_id="evt_" + str(reference),
            position=int(position),
            timestamp=int(timestamp),
            inserted=int(rowid),
            backfill=json.loads(bytes(request)).get("beneficiary") == BACKFILL_BENEFICIARY,
        )
        for rowid, reference, position, timestamp, request in rows
    ]


def snapshot(database_url: str, db_path: Path, feeds: dict[str, str]) -> Snapshot:
    events = provider_events(db_path)
    names = sorted(feeds)

    async def query(conn: AsyncConnection) -> Snapshot:
        rows = await conn.execute(
            text(
                "SELECT name, kind, applied_position, closed_through_timestamp "
                "FROM feed_checkpoints WHERE name = ANY(:names)"
            ),
            {"names": names},
        )
        checkpoints = {
            str(r[0]): Checkpoint(str(r[0]), str(r[1]), _int(r[2]), _int(r[3])) for r in rows
        }
        rows = await conn.execute(
            text(
                "SELECT feed, event_id, state, reason, "
                "extract(epoch FROM clock_timestamp() - first_seen_at)::float8 "
                "FROM feed_receipts WHERE feed = ANY(:names)"
            ),
            {"names": names},
        )
        receipts = [Receipt(str(r[0]), str(r[1]), str(r[2]), str(r[3]), float(r[4])) for r in rows]
        rows = await conn.execute(
            text(
                "SELECT feed, kind, count(*) FROM feed_alarms WHERE feed = ANY(:names) "
                "GROUP BY feed, kind"
            ),
            {"names": names},
        )
        alarms = Counter({(str(r[0]), str(r[1])): int(r[2]) for r in rows})
        return Snapshot(events, checkpoints, receipts, alarms)

    return _read(database_url, query)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _read(database_url: str, query: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    async def go() -> T:
        engine = create_async_engine(
            async_url(database_url), connect_args={"timeout": READ_TIMEOUT}
        )
        try:
            async with asyncio.timeout(READ_TIMEOUT), engine.connect() as conn:
                return await query(conn)
        finally:
            await engine.dispose()

    return asyncio.run(go())


# -- during the run, and at the end --------------------------------------------------------------


class FeedWatch:
    """A thread that reads the feeds every ``SAMPLE_EVERY`` s while the run goes on and
    keeps the first violation of each (rule, feed, event); a reading that fails (PostgreSQL
    taken away) is counted and skipped."""

    def __init__(
        self, database_url: str, db_path: Path, feeds: dict[str, str], hold_limit: float
    ) -> None:
        self._database_url = database_url
        self._db_path = db_path
        self._feeds = feeds
        self._hold_limit = hold_limit
        self.violations: dict[tuple[str, str, str], Violation] = {}
        self.samples = 0
        self.skipped = 0
        self.last_error = ""  # why the last skipped reading failed
        self.holds_seen: set[tuple[str, str]] = set()
        self.oldest_hold = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="feed-watch", daemon=True)

    def start(self) -> FeedWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(READ_TIMEOUT * 2)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self.sample()

    def sample(self) -> None:
        try:
            snap = snapshot(self._database_url, self._db_path, self._feeds)
        except Exception as exc:  # PostgreSQL restarting or cut off: the next reading will do
            self.skipped += 1
            self.last_error = repr(exc)[:200]
            return
        self.samples += 1
        for receipt in snap.receipts:
            if receipt.state == "held":
                self.holds_seen.add((receipt.feed, receipt.event_id))
                self.oldest_hold = max(self.oldest_hold, receipt.age)
        for v in sample_violations(snap, self._feeds, self._hold_limit):
            self.violations.setdefault((v.rule, v.feed, v.event_id), v)

    def render(self) -> str:
        skipped = f"{self.skipped} skipped" + (
            f", the last: {self.last_error}" if self.skipped else ""
        )
        return (
            f"feed readings during the run {self.samples} ({skipped}); holds seen "
            f"{len(self.holds_seen)}, the oldest {self.oldest_hold:.1f} s"
        )


@dataclass
class FinalCheck:
    snapshot: Snapshot
    violations: list[Violation]  # of the last reading
    waited: float  # seconds until the rules held (or patience ran out)
    pending: Counter[tuple[str, str]]  # (feed, rule): what the first reading still lacked

    def render(self) -> str:
        pending = ", ".join(f"{f} {r} x{n}" for (f, r), n in sorted(self.pending.items()))
        return f"feeds caught up {self.waited:.1f} s after the settling phase" + (
            f" (it still lacked: {pending})" if pending else ""
        )


def final_check(
    database_url: str, db_path: Path, feeds: dict[str, str], hold_limit: float
) -> FinalCheck:
    """Read the feeds every ``CATCH_UP_POLL`` s until every rule holds, or
    ``CATCH_UP_PATIENCE`` runs out."""
    started = time.monotonic()
    deadline = started + CATCH_UP_PATIENCE
    pending: Counter[tuple[str, str]] | None = None
    while True:
        try:
            snap = snapshot(database_url, db_path, feeds)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(CATCH_UP_POLL)
            continue
        found = final_violations(snap, feeds, hold_limit)
        if pending is None:
            pending = Counter((v.feed, v.rule) for v in found)
        if not found or time.monotonic() > deadline:
            return FinalCheck(snap, found, time.monotonic() - started, pending)
        time.sleep(CATCH_UP_POLL)
