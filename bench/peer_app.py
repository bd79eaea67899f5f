"""The peers of ``make bench``: the same ledger transfer (``bench.peer_transfer``) behind an
idempotency layer a Python service often takes off the shelf, one layer per server process,
chosen by ``BENCH_PEER_LAYER``. Each takes the body of ``POST /v1/transfers`` and its
``Idempotency-Key`` header; its handler is sync and runs in a thread (``sync_to_thread=True``);
the app is served by ``bench.serve``, as ``settlement serve`` serves ours.

``powertools``: ``POST /bench/powertools-transfer`` runs the transfer inside an
``idempotent_function`` of aws-lambda-powertools, whose ``RedisCachePersistenceLayer`` keeps
its records in the bench's Redis (sync redis-py, in the handler's thread). No payload
validation: on the Redis layer ``payload_validation_jmespath`` refuses every identical retry of
a completed key (its completed record carries no payload hash), so a changed body under a
reused key is answered with the first body's result. No lease or fencing: a record in
progress has no expiry without a Lambda context, so a worker that dies mid-transfer leaves its
key answering 409 until the record's TTL; an execution that raises deletes the record, so a
retry runs again. ``POST /bench/peer-plain-transfer`` is the same transaction without
Powertools: what ``plain-transfer`` is compared to.

``asgi-idem``: ``POST /bench/asgi-idem-transfer`` behind asgi-idempotency-header's
``IdempotencyHeaderMiddleware`` (app-wide ASGI middleware, as its documentation adds it) on
its ``RedisBackend`` (redis.asyncio, on the worker's event loop). A replay is two Redis reads
(the stored JSON body, then its status code) and a response rebuilt from them; a new key is a
read, a ``SADD`` to one set of every key ever seen (whose answer says whether the key is
new), the transfer, then two ``SET`` and two ``EXPIRE``. It keeps only ``application/json``
answers; it has no payload validation (a changed body under a reused key gets the first
answer) and no lease (a key whose request is in flight answers 409; a worker that dies
mid-request leaves its key answering 409 for good, as does every key once its stored answer
expires, for the set's members never expire).

Neither peer authenticates: the operation rows name ``BENCH_PEER_PRINCIPAL``.

Run: ``BENCH_PEER_LAYER=powertools python -m bench.peer_app --port P --workers N``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from litestar import Litestar, Response, get, post
from litestar.di import Provide
from litestar.middleware import DefineMiddleware
from litestar.params import Parameter

from bench import serve
from bench.peer_transfer import PeerTransfer, TransferBody, made, problem
from bench.stack import plain_url

__all__ = [
    "ASGI_IDEM_KEYS",
    "ASGI_IDEM_PATH",
    "LAYERS",
    "PEER_PLAIN_PATH",
    "POWERTOOLS_PATH",
    "app_factory",
    "main",
    "route",
    "validation_probe",
]

POWERTOOLS_PATH = "/bench/powertools-transfer"
# The same transaction with no idempotency layer around it: the peer's plain transfer.
PEER_PLAIN_PATH = "/bench/peer-plain-transfer"
ASGI_IDEM_PATH = "/bench/asgi-idem-transfer"
# The layer each server process serves, and the path of its idempotent route.
LAYER_ENV = "BENCH_PEER_LAYER"
LAYERS = {"powertools": POWERTOOLS_PATH, "asgi-idem": ASGI_IDEM_PATH}
# The environment variable naming the principal the operation rows belong to (no auth here).
PRINCIPAL_ENV = "BENCH_PEER_PRINCIPAL"
# Records kept as long as the server keeps a completed operation (expires_at: one day).
RECORD_TTL_SECONDS = 24 * 3600
# asgi-idempotency-header's Redis names: the set of every key seen, and its answers' prefix.
ASGI_IDEM_KEYS = "bench-asgi-idem-keys"
ASGI_IDEM_ANSWERS = "bench-asgi-idem:"

log = logging.getLogger("bench.peer_app")

Key = Annotated[str, Parameter(header="Idempotency-Key", min_length=1, max_length=255)]


def route(layer: str) -> str:
    """The route the operation rows of ``layer`` name: ``POST <its path>``."""
    return f"POST {LAYERS[layer]}"


class Powertools:
    """:meth:`PeerTransfer.run` inside Powertools' ``idempotent_function`` on its Redis layer."""

    def __init__(self, transfer: PeerTransfer, redis_url: str) -> None:
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import (
            RedisCachePersistenceLayer,
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
        self.run: Callable[..., dict[str, Any]] = idempotent_function(
            transfer.run,
            data_keyword_argument="request",
            persistence_store=store,
            config=config,
            key_prefix="bench-peer",
        )


class _Opened:
    transfer: PeerTransfer | None = None

    def get(self) -> PeerTransfer:
        assert self.transfer is not None, "the application has not started"
        return self.transfer


@get("/health", sync_to_thread=False)
def health() -> dict[str, bool]:
    return {"ok": True}


@post(POWERTOOLS_PATH, status_code=201, sync_to_thread=True)
def powertools_transfer(data: TransferBody, powertools: Powertools, key: Key) -> Response[bytes]:
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyAlreadyInProgressError,
    )

    try:
        return made(powertools.run, key, data)
    except IdempotencyAlreadyInProgressError:
        return problem(409, "in progress")


@post(PEER_PLAIN_PATH, status_code=201, sync_to_thread=True)
def peer_plain_transfer(data: TransferBody, transfer: PeerTransfer, key: Key) -> Response[bytes]:
    """The peer's transaction alone: what a user of the peer pays without idempotency."""
    return made(transfer.run, key, data)


@post(ASGI_IDEM_PATH, status_code=201, sync_to_thread=True)
def asgi_idem_transfer(data: TransferBody, transfer: PeerTransfer, key: Key) -> Response[bytes]:
    """The transaction alone; the app's middleware makes it idempotent."""
    return made(transfer.run, key, data)


def app_factory() -> Litestar:
    """ASGI factory: the layer from ``BENCH_PEER_LAYER``; database, Redis, pool size and log
    format from the server's settings."""
    from service.config import Settings
    from service.logs import configure_logging

    settings = Settings.from_env()
    configure_logging(settings)
    if settings.database_url is None or settings.redis_url is None:
        raise SystemExit("the peer needs SETTLEMENT_DATABASE_URL and SETTLEMENT_REDIS_URL")
    layer = os.environ.get(LAYER_ENV, "powertools")
    if layer not in LAYERS:
        raise SystemExit(f"{LAYER_ENV} must be one of {', '.join(LAYERS)}, got {layer!r}")
    transfer = PeerTransfer(
        plain_url(settings.database_url),
        settings.db_pool_size,
        os.environ[PRINCIPAL_ENV],
        route(layer),
    )
    opened = _Opened()
    dependencies = {"transfer": Provide(opened.get, sync_to_thread=False)}
    closing: list[Callable[[], Any]] = []
    if layer == "powertools":
        # Powertools warns on every process's first call that there is no Lambda context
        warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
        powertools = Powertools(transfer, settings.redis_url)
        dependencies["powertools"] = Provide(lambda: powertools, sync_to_thread=False)
        handlers = [health, powertools_transfer, peer_plain_transfer]
        middleware: list[DefineMiddleware] = []
    else:
        from idempotency_header_middleware import IdempotencyHeaderMiddleware
        from idempotency_header_middleware.backends import RedisBackend
        from redis.asyncio import Redis

        redis = Redis.from_url(settings.redis_url)
        backend = RedisBackend(
            redis=redis,
            keys_key=ASGI_IDEM_KEYS,
            response_key=ASGI_IDEM_ANSWERS,
            expiry=RECORD_TTL_SECONDS,
        )
        closing.append(redis.aclose)
        handlers = [health, asgi_idem_transfer]
        # the package types its middleware for Starlette's ASGI aliases, not Litestar's
        peer: Any = IdempotencyHeaderMiddleware
        middleware = [DefineMiddleware(peer, backend=backend)]

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        transfer.open()
        opened.transfer = transfer
        log.info("server ready")  # what bench.stack waits for, once per worker
        try:
            yield
        finally:
            opened.transfer = None
            transfer.close()
            for close in closing:
                await close()

    return Litestar(
        route_handlers=handlers,
        dependencies=dependencies,
        middleware=middleware,
        lifespan=[lifespan],
        openapi_config=None,
        logging_config=None,  # service.logs, as the server
        debug=False,
    )


def validation_probe(redis_url: str) -> str:
    """What Powertools' ``payload_validation_jmespath`` makes of an identical retry of a
    completed key on the Redis layer: the exception's name, or ``"replayed"``. One record under
    a fresh key, no database: the reason its peer runs without validation, checked each run."""
    import uuid

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
