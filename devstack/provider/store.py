"""The simulator's durable store: one SQLite file, one row per sink key.

WAL with ``synchronous=FULL`` makes each commit durable before it is answered, so a payment
survives the simulator's restart (and its crash). Every call is short and synchronous; the
app runs them with ``asyncio.to_thread``. One connection, serialised by a lock, is enough
for a test double; ``BEGIN IMMEDIATE`` keeps a second process on the same file honest too.

Each row also has its place in the event feeds (:mod:`devstack.provider.feeds`): an integer
``position``, unique, given at commit, and a ``timestamp`` in whole Unix seconds. A file made
before those columns existed is migrated when it is opened: the columns are added, existing
rows get positions ``POSITION_STEP, 2 * POSITION_STEP, ...`` in insertion (rowid) order and
the whole second of their ``created_at`` as timestamp, all in one transaction.

The file holds every payout and its signed evidence, so it, its ``-wal`` and its ``-shm``
are readable by their owner only (0600): the file is made so before SQLite opens it (which
gives the other two its mode), and one left more open by an earlier run is narrowed.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec

from devstack.provider.payments import Outcome, Payment

__all__ = ["POSITION_STEP", "Counts", "Entry", "PaymentStore", "Stamp", "Transaction"]

# A second process on the same file (a simulator restarting) may hold the write lock briefly.
BUSY_TIMEOUT = 5.0
# Positions of successive commits are this far apart, so a feed fault can put an event
# between two that were already served (see feeds.py, fault backfill).
POSITION_STEP = 10

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    sink_key   TEXT PRIMARY KEY,
    reference  TEXT NOT NULL UNIQUE,
    request    BLOB NOT NULL,
    outcome    TEXT NOT NULL CHECK (outcome IN ('completed', 'declined')),
    status     INTEGER NOT NULL,
    evidence   BLOB NOT NULL,
    signature  TEXT NOT NULL,
    created_at TEXT NOT NULL,
    position   INTEGER NOT NULL,
    timestamp  INTEGER NOT NULL
)
"""

# Added to a file made before the feeds; the defaults are overwritten at once by _BACKFILL.
_ADD_POSITION = "ALTER TABLE payments ADD COLUMN position INTEGER NOT NULL DEFAULT 0"
_ADD_TIMESTAMP = "ALTER TABLE payments ADD COLUMN timestamp INTEGER NOT NULL DEFAULT 0"
_BACKFILL_POSITION = f"""
UPDATE payments SET position = numbered.n * {POSITION_STEP}
FROM (SELECT rowid AS id, ROW_NUMBER() OVER (ORDER BY rowid) AS n FROM payments) AS numbered
WHERE payments.rowid = numbered.id
"""
_BACKFILL_TIMESTAMP = (
    "UPDATE payments SET timestamp = COALESCE(CAST(strftime('%s', created_at) AS INTEGER), 0)"
)
_INDEXES = (
    "CREATE UNIQUE INDEX IF NOT EXISTS payments_by_position ON payments (position)",
    "CREATE INDEX IF NOT EXISTS payments_by_timestamp ON payments (timestamp, position)",
)

_COLUMNS = "sink_key, reference, request, outcome, status, evidence, signature, created_at"
_ENTRY = "reference, position, timestamp, evidence, signature"

# Rows looked at when searching for a free position below a cursor: bounds that search.
_GAP_SEARCH_ROWS = 64


class Counts(msgspec.Struct, frozen=True):
    """Committed successful payments and recorded declines."""

    count: int
    declines: int


class Stamp(msgspec.Struct, frozen=True):
    """Where a new row goes in the feeds."""

    position: int
    timestamp: int


class Entry(msgspec.Struct, frozen=True):
    """A row as the feeds serve it: its reference, its place, its signed evidence."""

    reference: str
    position: int
    timestamp: int
    evidence: bytes
    signature: str


class Transaction:
    """Queries inside one ``BEGIN IMMEDIATE`` transaction (see :meth:`PaymentStore.transaction`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def find(self, sink_key: str) -> Payment | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM payments WHERE sink_key = ?", (sink_key,)
        ).fetchone()
        return None if row is None else _payment(row)

    def insert(self, payment: Payment, stamp: Stamp) -> None:
        self._conn.execute(
            f"INSERT INTO payments ({_COLUMNS}, position, timestamp) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                payment.sink_key,
                payment.reference,
                payment.request,
                payment.outcome,
                payment.status,
                payment.evidence,
                payment.signature,
                payment.created_at,
                stamp.position,
                stamp.timestamp,
            ),
        )

    def last_position(self) -> int:
        """The highest position given so far, 0 when there is none."""
        row = self._conn.execute("SELECT COALESCE(MAX(position), 0) FROM payments").fetchone()
        return int(row[0])

    def last_timestamp(self) -> int:
        """The highest timestamp given so far, 0 when there is none."""
        row = self._conn.execute("SELECT COALESCE(MAX(timestamp), 0) FROM payments").fetchone()
        return int(row[0])

    def after_position(self, position: int, limit: int) -> list[Entry]:
        """At most ``limit`` rows with a position above ``position``, ascending."""
        return self._entries(
            "WHERE position > ? ORDER BY position LIMIT ?", (position, limit), reverse=False
        )

    def up_to_position(self, position: int, limit: int) -> list[Entry]:
        """The last ``limit`` rows with a position at or below ``position``, ascending."""
        return self._entries(
            "WHERE position <= ? ORDER BY position DESC LIMIT ?", (position, limit), reverse=True
        )

    def at_position(self, position: int) -> Entry | None:
        found = self._entries("WHERE position = ?", (position,), reverse=False)
        return found[0] if found else None

    def free_position_below(self, position: int) -> int | None:
        """A position no row has, between the two highest rows at or below ``position`` that
        have room between them (0 counts as the row below the first), or None when the last
        few such rows are packed."""
        rows = self._conn.execute(
            "SELECT position FROM payments WHERE position <= ? ORDER BY position DESC LIMIT ?",
            (position, _GAP_SEARCH_ROWS),
        ).fetchall()
        taken = [int(row[0]) for row in rows]
        if len(taken) < _GAP_SEARCH_ROWS:
            taken.append(0)
        for high, low in itertools.pairwise(taken):
            if high - low > 1:
                return low + (high - low) // 2
        return None

    def after_timestamp(self, timestamp: int | None, limit: int) -> list[Entry]:
        """At most ``limit`` rows with a timestamp above ``timestamp`` (every row when None),
        ordered by timestamp, then position."""
        after = -1 if timestamp is None else timestamp
        return self._entries(
            "WHERE timestamp > ? ORDER BY timestamp, position LIMIT ?",
            (after, limit),
            reverse=False,
        )

    def up_to_timestamp(self, timestamp: int, limit: int) -> list[Entry]:
        """The last ``limit`` rows, in (timestamp, position) order, with a timestamp at or below
        ``timestamp``; ascending."""
        return self._entries(
            "WHERE timestamp <= ? ORDER BY timestamp DESC, position DESC LIMIT ?",
            (timestamp, limit),
            reverse=True,
        )

    def _entries(self, where: str, params: tuple[int, ...], *, reverse: bool) -> list[Entry]:
        rows = self._conn.execute(f"SELECT {_ENTRY} FROM payments {where}", params).fetchall()
        entries = [
            Entry(
                reference=row[0],
                position=int(row[1]),
                timestamp=int(row[2]),
                evidence=bytes(row[3]),
                signature=row[4],
            )
            for row in rows
        ]
        if reverse:
            entries.reverse()
        return entries


class PaymentStore:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> PaymentStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        _private(path)
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        return cls(conn)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One ``BEGIN IMMEDIATE`` transaction under the lock: committed when the block ends,
        rolled back when it raises. Holding SQLite's write lock, it also orders itself against
        every commit of another process on the same file."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self._conn)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def find(self, sink_key: str) -> Payment | None:
        with self._lock:
            return Transaction(self._conn).find(sink_key)

    def commit(
        self, payment: Payment, stamp: Callable[[Transaction], Stamp]
    ) -> tuple[Payment, bool]:
        """Insert unless the sink key already has a row; return the row that stands and
        whether it is the one just inserted. Two concurrent commits make one payment.
        ``stamp`` places the new row in the feeds; it runs only when a row is inserted,
        inside the transaction."""
        with self.transaction() as tx:
            existing = tx.find(payment.sink_key)
            if existing is not None:
                return existing, False
            tx.insert(payment, stamp(tx))
        return payment, True

    def counts(self, sink_key: str | None = None) -> Counts:
        query = (
            "SELECT COALESCE(SUM(outcome = 'completed'), 0), COALESCE(SUM(outcome = 'declined'), 0)"
            " FROM payments"
        )
        with self._lock:
            if sink_key is None:
                row = self._conn.execute(query).fetchone()
            else:
                row = self._conn.execute(query + " WHERE sink_key = ?", (sink_key,)).fetchone()
        return Counts(count=int(row[0]), declines=int(row[1]))


def _private(path: Path) -> None:
    """Make ``path`` (an empty file if new), its ``-wal`` and ``-shm`` readable by us only."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            if name.stat().st_mode & 0o077:
                name.chmod(0o600)
        except FileNotFoundError:
            continue


def _migrate(conn: sqlite3.Connection) -> None:
    """Create the table, or bring a file made before the feeds up to date, atomically."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_SCHEMA)
        columns = {row[1] for row in conn.execute("PRAGMA table_info(payments)")}
        if "position" not in columns:
            conn.execute(_ADD_POSITION)
            conn.execute(_BACKFILL_POSITION)
        if "timestamp" not in columns:
            conn.execute(_ADD_TIMESTAMP)
            conn.execute(_BACKFILL_TIMESTAMP)
        for statement in _INDEXES:
            conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _payment(row: Any) -> Payment:
    outcome: Outcome = "completed" if row[3] == "completed" else "declined"
    return Payment(
        sink_key=row[0],
        reference=row[1],
        request=bytes(row[2]),
        outcome=outcome,
        status=int(row[4]),
        evidence=bytes(row[5]),
        signature=row[6],
        created_at=row[7],
    )
