"""The peer of ``make bench``: the same ledger transfer behind another idempotency layer.

``POST /bench/powertools-transfer`` takes the body of ``POST /v1/transfers`` and its
``Idempotency-Key`` header and runs the transfer inside an ``idempotent_function`` of
aws-lambda-powertools, whose ``RedisCachePersistenceLayer`` keeps the records in the bench's
Redis. The transfer is sync psycopg 3 on a ``psycopg_pool.ConnectionPool`` with the server's
pool size (``SETTLEMENT_DB_POOL_SIZE``), one transaction: a minimal operation row (the
foreign-key parent of ``transfers``), both accounts locked in id order, two balance updates,
the transfer row. The handler is sync and runs in a thread (``sync_to_thread=True``); the app
is served by ``bench.serve``, as ``settlement serve`` serves ours.

What the peer does not do, and the server does: no API-key authentication (the operation row
names the bench client, ``BENCH_PEER_PRINCIPAL``); no payload validation, because on the
Redis layer Powertools' ``payload_validation_jmespath`` refuses every identical retry of a
completed key (its completed record carries no payload hash), so a changed body under a
reused key is answered with the first body's result; no lease or fencing (a record in
progress has no expiry without a Lambda context: a worker that dies mid-transfer leaves its
key answering 409 until the record's TTL); an execution that raises deletes the record, so a
retry runs again.

The operation row's ``idempotency_key`` is ``<Idempotency-Key>/<operation id>``: unique per
execution, so the schema's scope constraint never stands in for Powertools, and the bench can
count executions per key.

Run: ``python -m bench.peer_app --port P --workers N``.
"""

from __future__ import annotations

import logging
import uuid
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Litestar, Response, get, post
from litestar.di import Provide
from litestar.params import Parameter

from bench import serve
from bench.fixtures import TENANT
from bench.stack import plain_url

__all__ = [
    "PEER_PATH",
    "PEER_PLAIN_PATH",
    "PEER_ROUTE",
    "TransferBody",
    "app_factory",
    "main",
    "validation_probe",
]

PEER_PATH = "/bench/powertools-transfer"
PEER_ROUTE = f"POST {PEER_PATH}"
# The same transaction with no idempotency layer around it: the peer's plain transfer.
PEER_PLAIN_PATH = "/bench/peer-plain-transfer"
# The environment variable naming the principal the operation rows belong to (no auth here).
PRINCIPAL_ENV = "BENCH_PEER_PRINCIPAL"
# Records kept as long as the server keeps a completed operation (expires_at: one day).
RECORD_TTL_SECONDS = 24 * 3600
# A pool that cannot open its connections in this long fails the worker's start.
POOL_OPEN_TIMEOUT = 30.0
# Stands in for a request fingerprint in the minimal operation row (never compared).
_NO_FINGERPRINT = "0" * 64

log = logging.getLogger("bench.peer_app")


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


class Peer:
    """One worker's pool and idempotent transfer; opened by the app's lifespan."""

    def __init__(self, database_url: str, redis_url: str, pool_size: int, principal: str) -> None:
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
        )
        from psycopg_pool import ConnectionPool

        self.principal = uuid.UUID(principal)
        self.pool = ConnectionPool(
            database_url,
            min_size=pool_size,
            max_size=pool_size,
            kwargs={"autocommit": True},  # one explicit transaction per transfer
            open=False,
        )
        with warnings.catch_warnings():
            # the name is deprecated in favour of CachePersistenceLayer, the same class
            warnings.simplefilter("ignore", DeprecationWarning)
            store = RedisCachePersistenceLayer(url=redis_url)
        config = IdempotencyConfig(
            event_key_jmespath="key",
            raise_on_no_idempotency_key=True,
            expires_after_seconds=RECORD_TTL_SECONDS,
        )
        self.transfer: Callable[..., dict[str, Any]] = idempotent_function(
            self._transfer,
            data_keyword_argument="request",
            persistence_store=store,
            config=config,
            key_prefix="bench-peer",
        )

    def open(self) -> None:
        self.pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT)

    def plain_transfer(self, *, request: dict[str, Any]) -> dict[str, Any]:
        """The transaction of :meth:`transfer` without Powertools around it."""
        return self._transfer(request=request)

    def close(self) -> None:
        self.pool.close()

    def _transfer(self, *, request: dict[str, Any]) -> dict[str, Any]:
        """Run once per key by Powertools: ``request`` is ``{"key": ..., "body": TransferBody}``."""
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
                    "route": PEER_ROUTE,
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
        # what Powertools stores and replays: JSON-ready, the server's transfer body
        return {
            "id": str(transfer_id),
            "source": str(body.source),
            "destination": str(body.destination),
            "amount": body.amount,
            "currency": body.currency,
            "memo": body.memo,
            "created_at": created_at.isoformat(),
        }


class _Opened:
    peer: Peer | None = None

    def get(self) -> Peer:
        assert self.peer is not None, "the application has not started"
        return self.peer


@get("/health", sync_to_thread=False)
def health() -> dict[str, bool]:
    return {"ok": True}


@post(PEER_PATH, status_code=201, sync_to_thread=True)
def powertools_transfer(
    data: TransferBody,
    peer: Peer,
    key: Annotated[str, Parameter(header="Idempotency-Key", min_length=1, max_length=255)],
) -> Response[bytes]:
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyAlreadyInProgressError,
    )

    try:
        return _made(peer.transfer, key, data)
    except IdempotencyAlreadyInProgressError:
        return _problem(409, "in progress")


@post(PEER_PLAIN_PATH, status_code=201, sync_to_thread=True)
def peer_plain_transfer(
    data: TransferBody,
    peer: Peer,
    key: Annotated[str, Parameter(header="Idempotency-Key", min_length=1, max_length=255)],
) -> Response[bytes]:
    """The peer's transaction alone: what a user of the peer pays without idempotency."""
    return _made(peer.plain_transfer, key, data)


def _made(transfer: Callable[..., dict[str, Any]], key: str, body: TransferBody) -> Response[bytes]:
    """201 with the transfer ``transfer`` made, or 422 when it was refused (not expected
    here: every bench account is funded)."""
    try:
        made = transfer(request={"key": key, "body": body})
    except Refused as refused:
        return _problem(422, str(refused))
    return Response(
        content=msgspec.json.encode(made), status_code=201, media_type="application/json"
    )


def _problem(status: int, detail: str) -> Response[bytes]:
    return Response(
        content=msgspec.json.encode({"status": status, "detail": detail}),
        status_code=status,
        media_type="application/problem+json",
    )


def app_factory() -> Litestar:
    """ASGI factory: database, Redis, pool size and log format from the server's settings."""
    import os

    from service.config import Settings
    from service.logs import configure_logging

    settings = Settings.from_env()
    configure_logging(settings)
    if settings.database_url is None or settings.redis_url is None:
        raise SystemExit("the peer needs SETTLEMENT_DATABASE_URL and SETTLEMENT_REDIS_URL")
    # Powertools warns on every process's first call that there is no Lambda context
    warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
    peer = Peer(
        plain_url(settings.database_url),
        settings.redis_url,
        settings.db_pool_size,
        os.environ[PRINCIPAL_ENV],
    )
    opened = _Opened()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        peer.open()
        opened.peer = peer
        log.info("server ready")  # what bench.stack waits for, once per worker
        try:
            yield
        finally:
            opened.peer = None
            peer.close()

    return Litestar(
        route_handlers=[health, powertools_transfer, peer_plain_transfer],
        dependencies={"peer": Provide(opened.get, sync_to_thread=False)},
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,  # service.logs, as the server
        debug=False,
    )


def validation_probe(redis_url: str) -> str:
    """What Powertools' ``payload_validation_jmespath`` makes of an identical retry of a
    completed key on the Redis layer: the exception's name, or ``"replayed"``. One record under
    a fresh key, no database: the reason the peer runs without validation, checked each run."""
    from aws_lambda_powertools.utilities.idempotency import (
        IdempotencyConfig,
        idempotent_function,
    )
    from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
        RedisCachePersistenceLayer,
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecated name; no Lambda context
        store = RedisCachePersistenceLayer(url=redis_url)
        config = IdempotencyConfig(event_key_jmespath="key", payload_validation_jmespath="body")

        def echo(*, request: dict[str, Any]) -> dict[str, Any]:
            return {"amount": request["body"]["amount"]}

        run = idempotent_function(
            echo,
            data_keyword_argument="request",
            persistence_store=store,
            config=config,
            key_prefix="bench-peer-probe",
        )
        request = {"key": str(uuid.uuid4()), "body": {"amount": 1}}
        run(request=request)
        try:
            run(request=request)
        except Exception as exc:
            return type(exc).__name__
    return "replayed"


def main(argv: list[str] | None = None) -> None:
    serve.main("bench.peer_app:app_factory", "python -m bench.peer_app", argv)


if __name__ == "__main__":
    main()
