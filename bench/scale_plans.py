"""The plans of the server's statements on the filled database (``make bench-scale``): each
run once with ``EXPLAIN (ANALYZE, BUFFERS)`` inside a transaction that is rolled back, so a
plan that reads a whole principal's rows (or a whole table) shows, with its time, beside the
index it should have used.

The statements are the server's own text (``service.store``), never copies; the purge and the
tombstone reads are SQLAlchemy ``text()`` with named parameters, turned into asyncpg's ``$n``.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg

__all__ = ["explain_all"]

_NAMED = re.compile(r"(?<![:\w]):(\w+)")
_EXECUTION = re.compile(r"^Execution Time: ([\d.]+) ms")


def _positional(sql: str, values: dict[str, Any]) -> tuple[str, list[Any]]:
    """``:name`` placeholders as ``$1``, ``$2``, ... and their values in that order."""
    order: list[str] = []

    def place(match: re.Match[str]) -> str:
        if match[1] not in order:
            order.append(match[1])
        return f"${order.index(match[1]) + 1}"

    return _NAMED.sub(place, sql), [values[name] for name in order]


def _statements(
    key_hash: bytes,
    owner: uuid.UUID,
    tenant: str,
    key: str,
    operation_id: uuid.UUID,
    now: datetime,
    doomed: list[uuid.UUID],
) -> dict[str, tuple[str, list[Any]]]:
    """``doomed``: the ids of one purge batch of ``tenant`` (what the cross-tenant read of
    the batch found of it)."""
    from service.app.purger import PURGE_BATCH
    from service.store import hot_sql, retention, status

    purge_at = now
    return {
        "identify (every idempotent request)": (
            hot_sql.IDENTIFY.sql,
            hot_sql.IDENTIFY.args(
                {
                    "key_hash": key_hash,
                    "tenant": tenant,
                    "route": "POST /v1/transfers",
                    "idempotency_key": key,
                    "now": now,
                }
            ),
        ),
        "status by id (GET /v1/operations/{id})": (status.BY_ID, [operation_id, None, tenant]),
        "status by key, no route (GET /v1/operations?key=)": (
            status.BY_KEY,
            [tenant, owner, key, None],
        ),
        "tombstone by key, no route (its 410)": _positional(
            retention._BY_KEY.text,
            {"tenant": tenant, "principal_id": owner, "key": key, "route": None},
        ),
        "purge, the batch across tenants (a read)": _positional(
            retention._PURGEABLE.text, {"now": purge_at, "batch": PURGE_BATCH}
        ),
        "purge, one tenant's part of it (rolled back)": _positional(
            retention._PURGE.text,
            {
                "tenant": tenant,
                "ids": doomed,
                "now": purge_at,
                "forget_at": purge_at + timedelta(days=30),
            },
        ),
        "oldest open operation (each purge pass)": (retention._OLDEST_OPEN.text, []),
    }


async def explain_all(
    conn: asyncpg.Connection,
    *,
    key_hash: bytes,
    owner: uuid.UUID,
    tenant: str,
    purge_now: datetime,
) -> dict[str, Any]:
    """Each statement's execution time (ms) and its plan (with buffers), on the oldest of
    ``owner``'s filled operations."""
    row = await conn.fetchrow(
        "SELECT id, idempotency_key FROM operations WHERE principal_id = $1"
        " ORDER BY created_at LIMIT 1",
        owner,
    )
    assert row is not None
    from service.app.purger import PURGE_BATCH
    from service.store import retention

    batch_sql, batch_args = _positional(
        retention._PURGEABLE.text, {"now": purge_now, "batch": PURGE_BATCH}
    )
    found = await conn.fetch(batch_sql, *batch_args)
    doomed = [r["id"] for r in found if r["tenant"] == tenant]
    plans: dict[str, Any] = {}
    for name, (sql, args) in _statements(
        key_hash, owner, tenant, row["idempotency_key"], row["id"], purge_now, doomed
    ).items():
        tr = conn.transaction()
        await tr.start()
        try:
            lines = [r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *args)]
        finally:
            await tr.rollback()
        took = next((_EXECUTION.search(line) for line in lines if _EXECUTION.search(line)), None)
        plans[name] = {
            "execution_ms": float(took[1]) if took else None,
            "plan": lines,
        }
    return plans
