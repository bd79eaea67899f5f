"""The simulator's durable store: one SQLite file, one row per sink key.

WAL with ``synchronous=FULL`` makes each commit durable before it is answered, so a payment
survives the simulator's restart (and its crash). Every call is short and synchronous; the
app runs them with ``asyncio.to_thread``. One connection, serialised by a lock, is enough
for a test double; ``BEGIN IMMEDIATE`` keeps a second process on the same file honest too.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

import msgspec

from devstack.provider.payments import Outcome, Payment

__all__ = ["Counts", "PaymentStore"]

# A second process on the same file (a simulator restarting) may hold the write lock briefly.
BUSY_TIMEOUT = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    sink_key   TEXT PRIMARY KEY,
    reference  TEXT NOT NULL UNIQUE,
    request    BLOB NOT NULL,
    outcome    TEXT NOT NULL CHECK (outcome IN ('completed', 'declined')),
    status     INTEGER NOT NULL,
    evidence   BLOB NOT NULL,
    signature  TEXT NOT NULL,
    created_at TEXT NOT NULL
)
"""

_COLUMNS = "sink_key, reference, request, outcome, status, evidence, signature, created_at"


class Counts(msgspec.Struct, frozen=True):
    """Committed successful payments and recorded declines."""

    count: int
    declines: int


class PaymentStore:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> PaymentStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_SCHEMA)
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

    def find(self, sink_key: str) -> Payment | None:
        with self._lock:
            return self._select(sink_key)

    def commit(self, payment: Payment) -> tuple[Payment, bool]:
        """Insert unless the sink key already has a row; return the row that stands and
        whether it is the one just inserted. Two concurrent commits make one payment."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._conn.execute(
                    f"INSERT INTO payments ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(sink_key) DO NOTHING",
                    (
                        payment.sink_key,
                        payment.reference,
                        payment.request,
                        payment.outcome,
                        payment.status,
                        payment.evidence,
                        payment.signature,
                        payment.created_at,
                    ),
                )
                created = cursor.rowcount == 1
                stored = self._select(payment.sink_key)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        assert stored is not None, "a row inserted or kept under the lock cannot vanish"
        return stored, created

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

    def _select(self, sink_key: str) -> Payment | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM payments WHERE sink_key = ?", (sink_key,)
        ).fetchone()
        if row is None:
            return None
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
