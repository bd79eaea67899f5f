"""The provider simulator's HTTP surface: payments keyed by a sink key, and a fault control.

``POST /payments`` honours ``Idempotency-Key`` as a sink key: the first call commits a payment
(or, with ``decline`` armed, a declined one) and every later call with that key gets the same
stored answer; the same key with a different body is refused with 422 and commits nothing.
Before anything is decoded or committed, a call must be signed by the settlement server
(:mod:`service.domain.provider_auth`: the sink key, a fresh timestamp and the exact body
under a key derived from the provider secret), else 401. Then the body must name the
reservation its sink key belongs to, and its ``request_fingerprint`` must be the one the
server computes for the payout it describes (:func:`~devstack.provider.payments.paid_fingerprint`),
else 422: evidence is only ever signed for a tuple that stands for what was paid.

``GET /feeds/cursor`` and ``GET /feeds/timestamp`` serve one event per committed payment, with
its signed evidence (the contract is in :mod:`devstack.provider.feeds`).

``/_sim/*`` is the control surface for tests and demos: ``POST /_sim/faults`` arms faults for
the next new payments, ``DELETE /_sim/faults`` clears them, ``GET /_sim/payments[?key=]``
counts committed payments and recorded declines; ``/_sim/feed-faults`` arms, lists and
clears misbehaviour of the feeds. With a control token (``SETTLEMENT_SIM_TOKEN``) every
``/_sim`` call needs ``Authorization: Bearer <token>``, else 401; without one the controls
are open, which :func:`devstack.provider.run.serve` allows only on a loopback address. The
feeds themselves need no token.

Faults apply only to a call that would create a new payment; a replay is always answered
normally, without delay or drop. A delayed commit runs in its own shielded task, so a caller
that gives up (or a cancelled request) never stops it; shutdown waits for such commits.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from litestar import Litestar, Request, Response, Router, delete, get, post
from litestar.background_tasks import BackgroundTask, BackgroundTasks
from litestar.connection import ASGIConnection
from litestar.datastructures import Cookie, State
from litestar.enums import MediaType
from litestar.exceptions import HTTPException
from litestar.handlers.base import BaseRouteHandler
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Send, TypeEncodersMap

from devstack.provider.faults import (
    Fault,
    FaultError,
    FaultMode,
    FaultQueue,
    FaultRequest,
    FeedFault,
    FeedFaultRequest,
)
from devstack.provider.feeds import FeedError, Feeds, parse_after, parse_cursor, parse_limit
from devstack.provider.payments import (
    Outcome,
    Payment,
    PaymentRequest,
    answer_body,
    new_reference,
    paid_fingerprint,
    record_payment,
)
from devstack.provider.store import Counts, PaymentStore
from service.domain.provider_auth import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    check_request,
    request_key,
)
from service.evidence import canonical

__all__ = ["MAX_BODY_SIZE", "MAX_KEY_LENGTH", "create_provider_app"]

log = logging.getLogger("settlement.provider")

T = TypeVar("T")

# Payment and fault bodies are a few hundred bytes; anything near this is not a real request.
MAX_BODY_SIZE = 64 * 1024
# Same bound as the settlement server's own Idempotency-Key (1-255 printable ASCII).
MAX_KEY_LENGTH = 255


class ClientError(Exception):
    """A request the simulator refuses; answered as ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class Health(msgspec.Struct, frozen=True):
    status: str


class Armed(msgspec.Struct, frozen=True):
    armed: list[Fault]


class ArmedFeedFaults(msgspec.Struct, frozen=True):
    armed: list[FeedFault]


class Simulator:
    """What one simulator process holds: the secrets, the store, the armed faults, the feeds."""

    def __init__(self, secret: str, db_path: Path, sim_token: str | None = None) -> None:
        self.secret = secret
        self.request_key = request_key(secret)
        self.sim_token = sim_token
        self.db_path = db_path
        self.faults = FaultQueue()
        self.feeds = Feeds(secret)
        self._store: PaymentStore | None = None
        self._commits: set[asyncio.Task[tuple[Payment, bool]]] = set()

    @property
    def store(self) -> PaymentStore:
        if self._store is None:
            raise RuntimeError("the payment store is opened by the app's lifespan")
        return self._store

    async def open(self) -> None:
        self._store = await asyncio.to_thread(PaymentStore.open, self.db_path)

    async def close(self) -> None:
        """Let in-flight commits finish (their callers may be gone), then close the store."""
        while self._commits:
            await asyncio.gather(*self._commits, return_exceptions=True)
        if self._store is not None:
            self._store.close()
            self._store = None

    async def pay(self, sink_key: str, request: PaymentRequest) -> Response[bytes]:
        wanted = canonical(request)
        existing = await asyncio.to_thread(self.store.find, sink_key)
        if existing is not None:
            return _answer(existing, wanted, replayed=True)
        fault = self.faults.take()
        if fault is not None:
            log.info("fault applied", extra={"sink_key": sink_key, "mode": fault.mode.value})
        mode = fault.mode if fault is not None else None
        if mode is FaultMode.ERROR_5XX:
            return Response(
                msgspec.json.encode({"error": "simulated provider failure"}),
                status_code=503,
                media_type=MediaType.JSON,
            )
        outcome: Outcome = "declined" if mode is FaultMode.DECLINE else "completed"
        delay = fault.delay if fault is not None else 0.0
        payment, created = await self._commit(sink_key, request, outcome, delay)
        if mode is FaultMode.DROP_RESPONSE and payment.request == wanted:
            return _DroppedResponse(
                answer_body(payment), status_code=payment.status, media_type=MediaType.JSON
            )
        return _answer(payment, wanted, replayed=not created)

    async def _commit(
        self, sink_key: str, request: PaymentRequest, outcome: Outcome, delay: float
    ) -> tuple[Payment, bool]:
        task = asyncio.create_task(self._delayed_commit(sink_key, request, outcome, delay))
        self._commits.add(task)
        task.add_done_callback(self._commit_done)
        return await asyncio.shield(task)

    async def _delayed_commit(
        self, sink_key: str, request: PaymentRequest, outcome: Outcome, delay: float
    ) -> tuple[Payment, bool]:
        if delay > 0:
            await asyncio.sleep(delay)
        payment = record_payment(
            sink_key,
            request,
            outcome=outcome,
            reference=new_reference(),
            now=datetime.now(UTC),
            secret=self.secret,
        )
        return await asyncio.to_thread(self.feeds.commit, self.store, payment)

    def _commit_done(self, task: asyncio.Task[tuple[Payment, bool]]) -> None:
        self._commits.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("payment commit failed", exc_info=exc)


def _answer(payment: Payment, wanted: bytes, *, replayed: bool) -> Response[bytes]:
    if payment.request != wanted:
        raise ClientError(422, "sink key reused with a different request")
    return Response(
        answer_body(payment),
        status_code=payment.status,
        media_type=MediaType.JSON,
        headers={"Idempotent-Replayed": "true" if replayed else "false"},
    )


class _TruncatedBody(ASGIResponse):
    """Announces the whole body in ``content-length``, sends half of it, and stops; the
    server then closes the connection, so the client sees a transport error."""

    __slots__ = ()

    async def send_body(self, send: Send, receive: Receive) -> None:
        prefix = self.body[: len(self.body) // 2]
        await send({"type": "http.response.body", "body": prefix, "more_body": True})


class _DroppedResponse(Response[bytes]):
    """A committed payment whose answer is lost on the wire (fault ``drop_response``)."""

    __slots__ = ()

    def to_asgi_response(
        self,
        app: Litestar | None,
        request: Request[Any, Any, Any],
        *,
        background: BackgroundTask | BackgroundTasks | None = None,
        cookies: Iterable[Cookie] | None = None,
        encoded_headers: Iterable[tuple[bytes, bytes]] | None = None,
        headers: dict[str, str] | None = None,
        is_head_response: bool = False,
        media_type: MediaType | str | None = None,
        status_code: int | None = None,
        type_encoders: TypeEncodersMap | None = None,
    ) -> ASGIResponse:
        return _TruncatedBody(
            body=self.content, status_code=self.status_code, media_type=MediaType.JSON
        )


def _simulator(state: State) -> Simulator:
    simulator: Simulator = state.simulator
    return simulator


def _sink_key(values: list[str]) -> str:
    if not values:
        raise ClientError(400, "the Idempotency-Key header is required")
    if len(values) > 1:
        raise ClientError(400, "send exactly one Idempotency-Key header")
    key = values[0].strip(" \t")
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= ch <= "~" for ch in key):
        raise ClientError(
            400, f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable ASCII characters"
        )
    return key


def _decode(body: bytes, type_: type[T]) -> T:
    try:
        return msgspec.json.decode(body, type=type_)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ClientError(400, str(exc)) from None


@post("/payments", status_code=201)
async def post_payment(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    simulator = _simulator(state)
    sink_key = _sink_key(request.headers.getall("idempotency-key", []))
    content = await request.body()
    refused = check_request(
        simulator.request_key,
        method=request.method,
        path=request.scope["path"],
        sink_key=sink_key,
        timestamps=request.headers.getall(TIMESTAMP_HEADER, []),
        signatures=request.headers.getall(SIGNATURE_HEADER, []),
        body=content,
        now=time.time(),
    )
    if refused is not None:
        log.warning("unauthenticated payment refused", extra={"reason": refused})
        raise ClientError(401, refused)
    payment = _decode(content, PaymentRequest)
    expected = f"{payment.operation_id}:{payment.binding_generation}"
    if sink_key != expected:
        # evidence names a reservation tuple: a key for another reservation is refused
        raise ClientError(422, f"the sink key must be {expected} for this reservation")
    try:
        paid = paid_fingerprint(payment)
    except msgspec.ValidationError as exc:
        raise ClientError(400, str(exc)) from None
    if not hmac.compare_digest(paid.encode(), payment.request_fingerprint.encode()):
        # evidence would name a fingerprint that does not stand for this payout
        raise ClientError(422, "request_fingerprint is not the fingerprint of this payout")
    return await simulator.pay(sink_key, payment)


def _bearer(values: list[str]) -> bytes | None:
    """The credentials of the one ``Authorization: Bearer`` header, as the bytes sent."""
    if len(values) != 1:
        return None
    scheme, _, credentials = values[0].strip(" \t").partition(" ")
    if scheme.lower() != "bearer":
        return None
    # latin-1 gives back the header's bytes as they came (headers are decoded as latin-1)
    return credentials.strip(" ").encode("latin-1", errors="replace")


def _control_token(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Guard of ``/_sim``: with a control token set, ``Authorization: Bearer <token>``."""
    simulator: Simulator = connection.app.state.simulator
    if simulator.sim_token is None:
        return
    given = _bearer(connection.headers.getall("authorization", []))
    if given is None or not hmac.compare_digest(given, simulator.sim_token.encode()):
        raise ClientError(
            401,
            "the simulator controls need Authorization: Bearer <SETTLEMENT_SIM_TOKEN>",
            headers={"WWW-Authenticate": 'Bearer realm="provider-simulator"'},
        )


@post("/faults", status_code=200)
async def arm_faults(request: Request[Any, Any, Any], state: State) -> Armed:
    faults = _simulator(state).faults
    try:
        faults.arm(_decode(await request.body(), FaultRequest))
    except FaultError as exc:
        raise ClientError(400, str(exc)) from None
    return Armed(armed=faults.armed())


@get("/faults")
async def list_faults(state: State) -> Armed:
    return Armed(armed=_simulator(state).faults.armed())


@delete("/faults", status_code=200)
async def clear_faults(state: State) -> Armed:
    faults = _simulator(state).faults
    faults.clear()
    return Armed(armed=faults.armed())


@post("/feed-faults", status_code=200)
async def arm_feed_faults(request: Request[Any, Any, Any], state: State) -> ArmedFeedFaults:
    fault = _decode(await request.body(), FeedFaultRequest)
    try:
        armed = await asyncio.to_thread(_simulator(state).feeds.arm, fault)
    except FaultError as exc:
        raise ClientError(400, str(exc)) from None
    return ArmedFeedFaults(armed=armed)


@get("/feed-faults")
async def list_feed_faults(state: State) -> ArmedFeedFaults:
    return ArmedFeedFaults(armed=await asyncio.to_thread(_simulator(state).feeds.armed))


@delete("/feed-faults", status_code=200)
async def clear_feed_faults(state: State) -> ArmedFeedFaults:
    return ArmedFeedFaults(armed=await asyncio.to_thread(_simulator(state).feeds.clear))


@get("/feeds/cursor")
async def cursor_feed(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    simulator = _simulator(state)
    query = request.query_params
    try:
        cursor = parse_cursor(query.getall("cursor", []))
        limit = parse_limit(query.getall("limit", []))
        page = await asyncio.to_thread(simulator.feeds.cursor_page, simulator.store, cursor, limit)
    except FeedError as exc:
        raise ClientError(400, str(exc)) from None
    return Response(msgspec.json.encode(page), media_type=MediaType.JSON)


@get("/feeds/timestamp")
async def timestamp_feed(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    simulator = _simulator(state)
    query = request.query_params
    try:
        after = parse_after(query.getall("after", []))
        limit = parse_limit(query.getall("limit", []))
    except FeedError as exc:
        raise ClientError(400, str(exc)) from None
    page = await asyncio.to_thread(simulator.feeds.timestamp_page, simulator.store, after, limit)
    return Response(msgspec.json.encode(page), media_type=MediaType.JSON)


@get("/payments")
async def count_payments(state: State, key: str | None = None) -> Counts:
    return await asyncio.to_thread(_simulator(state).store.counts, key)


@get("/health")
async def health() -> Health:
    return Health(status="ok")


def _client_error(request: Request[Any, Any, Any], exc: ClientError) -> Response[Any]:
    return Response({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    return Response({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.error("unhandled error", exc_info=exc)
    return Response({"error": "internal error"}, status_code=500)


def create_provider_app(secret: str, db_path: Path, *, sim_token: str | None = None) -> Litestar:
    """The simulator app; its SQLite store at ``db_path`` is opened by the lifespan.

    ``sim_token``, when given, is the bearer token every ``/_sim`` call must carry.
    """
    if not secret:
        raise ValueError("the provider secret must not be empty")
    if sim_token == "":
        raise ValueError("the control token must not be empty (None leaves the controls open)")
    simulator = Simulator(secret, db_path, sim_token)
    controls = Router(
        path="/_sim",
        route_handlers=[
            arm_faults,
            list_faults,
            clear_faults,
            arm_feed_faults,
            list_feed_faults,
            clear_feed_faults,
            count_payments,
        ],
        guards=[_control_token],
    )

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await simulator.open()
        log.info("provider simulator ready", extra={"db_path": str(db_path)})
        try:
            yield
        finally:
            await simulator.close()

    return Litestar(
        route_handlers=[post_payment, cursor_feed, timestamp_feed, controls, health],
        state=State({"simulator": simulator}),
        lifespan=[lifespan],
        exception_handlers={
            ClientError: _client_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        request_max_body_size=MAX_BODY_SIZE,
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
