"""The transfer both peers of ``make bench`` make idempotent, each in its own way
(``bench.peer_app``): the ledger transfer of ``POST /v1/transfers`` as a Python service often
writes it, sync psycopg 3 on a ``psycopg_pool.ConnectionPool`` with the server's pool size
(``SETTLEMENT_DB_POOL_SIZE``), one transaction: a minimal operation row (the foreign-key
parent of ``transfers``), both accounts locked in id order, two balance updates, the transfer
row.

The operation row's ``idempotency_key`` is ``<Idempotency-Key>/<operation id>``: unique per
execution, so the schema's scope constraint never stands in for a peer's idempotency layer,
and the bench can count executions per key. No authentication: the rows name the bench
client given to the peer (``BENCH_PEER_PRINCIPAL``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Response

from bench.fixtures import TENANT

__all__ = ["PeerTransfer", "Refused", "TransferBody", "made", "problem"]

# A pool that cannot open its connections in this long fails the worker's start.
POOL_OPEN_TIMEOUT = 30.0
# Stands in for a request fingerprint in the minimal operation row (never compared).
_NO_FINGERPRINT = "0" * 64


class TransferBody(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The body of ``POST /v1/transfers`` (its checks of the values are the server's)."""

    source: uuid.UUID
    destination: uuid.UUID
    amount: Annotated[int, msgspec.Meta(gt=0)]
    currency: Annotated[str, msgspec.Meta(pattern="^[A-Z]{3}$")]
    memo: str | None = None


class Refused(Exception):
    """The transfer cannot be made (missing account, other currency, too little money)."""


_INSERT_OPERATION = """
INSERT INTO operations (id, tenant, principal_id, route, idempotency_key, binding_generation,
       request_fingerprint, bound_principal_id, bound_credential_generation, state, revision,
       fencing_token)
VALUES (%(op)s, %(tenant)s, %(principal)s, %(route)s, %(key)s, 1, %(fingerprint)s,
       %(principal)s, 1, 'unknown', 1, 1)
"""
_LOCK_ACCOUNTS = """
SELECT id, currency, balance FROM accounts
 WHERE id = ANY(%(ids)s) AND tenant = %(tenant)s ORDER BY id FOR UPDATE
"""
_MOVE = "UPDATE accounts SET balance = balance + %(delta)s WHERE id = %(id)s"
_INSERT_TRANSFER = """
INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id, destination_id,
       amount, currency, memo, created_at)
VALUES (%(id)s, %(tenant)s, %(op)s, 1, %(source)s, %(destination)s, %(amount)s, %(currency)s,
       %(memo)s, %(created_at)s)
"""


class PeerTransfer:
    """One worker's pool and transaction; its operation rows name ``route``."""

    def __init__(self, database_url: str, pool_size: int, principal: str, route: str) -> None:
        from psycopg_pool import ConnectionPool

        self.principal = uuid.UUID(principal)
        self.route = route
        self.pool = ConnectionPool(
            database_url,
            min_size=pool_size,
            max_size=pool_size,
            kwargs={"autocommit": True},  # one explicit transaction per transfer
            open=False,
        )

    def open(self) -> None:
        self.pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT)

    def close(self) -> None:
        self.pool.close()

    def run(self, *, request: dict[str, Any]) -> dict[str, Any]:
        """One transfer: ``request`` is ``{"key": ..., "body": TransferBody}``; its answer
        (the server's transfer body, JSON-ready: what an idempotency layer stores)."""
        body: TransferBody = request["body"]
        operation_id = uuid.uuid4()
        transfer_id = uuid.uuid4()
        created_at = datetime.now(UTC)
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(
                _INSERT_OPERATION,
                {
                    "op": operation_id,
                    "tenant": TENANT,
                    "principal": self.principal,
                    "route": self.route,
                    "key": f"{request['key']}/{operation_id}",
                    "fingerprint": _NO_FINGERPRINT,
                },
            )
            ordered = sorted((body.source, body.destination))
            rows = conn.execute(_LOCK_ACCOUNTS, {"ids": ordered, "tenant": TENANT}).fetchall()
            found = {row[0]: row for row in rows}
            source, destination = found.get(body.source), found.get(body.destination)
            if source is None or destination is None:
                raise Refused("account not found")
            if source[1] != body.currency or destination[1] != body.currency:
                raise Refused("currency mismatch")
            if source[2] < body.amount:
                raise Refused("insufficient funds")
            conn.execute(_MOVE, {"delta": -body.amount, "id": body.source})
            conn.execute(_MOVE, {"delta": body.amount, "id": body.destination})
            conn.execute(
                _INSERT_TRANSFER,
                {
                    "id": transfer_id,
                    "tenant": TENANT,
                    "op": operation_id,
                    "source": body.source,
                    "destination": body.destination,
                    "amount": body.amount,
                    "currency": body.currency,
                    "memo": body.memo,
                    "created_at": created_at,
                },
            )
        return {
            "id": str(transfer_id),
            "source": str(body.source),
            "destination": str(body.destination),
            "amount": body.amount,
            "currency": body.currency,
            "memo": body.memo,
            "created_at": created_at.isoformat(),
        }


def made(transfer: Callable[..., dict[str, Any]], key: str, body: TransferBody) -> Response[bytes]:
    """201 with the transfer ``transfer(request=...)`` made, or 422 when it was refused (not
    expected here: every bench account is funded)."""
    try:
        answer = transfer(request={"key": key, "body": body})
    except Refused as refused:
        return problem(422, str(refused))
    return Response(
        content=msgspec.json.encode(answer), status_code=201, media_type="application/json"
    )


def problem(status: int, detail: str) -> Response[bytes]:
    return Response(
        content=msgspec.json.encode({"status": status, "detail": detail}),
        status_code=status,
        media_type="application/problem+json",
    )
