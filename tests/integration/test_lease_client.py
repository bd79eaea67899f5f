"""The lease commands' client (service.leases.make_lease_redis, bounded per command by the
LeaseManager) against a real Redis, against a relay in front of it that stops answering one
connection, and against servers that refuse or hang up."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from service.config import Settings
from service.leases import LeaseManager, LeaseUnavailable, make_lease_redis
from tests.conftest import Services
from tests.integration.redis_relay import RedisRelay

pytestmark = pytest.mark.integration

ConnectLeases = Callable[..., LeaseManager]

# Anything expected "promptly" on a loaded machine.
PROMPT = 5.0
# The lease commands' timeout where a test waits for it to run out.
SHORT = 0.5


def _prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


@asynccontextmanager
async def _muting(url: str, marker: str) -> AsyncIterator[tuple[RedisRelay, str]]:
    relay = RedisRelay(url, mute_on=marker)
    relayed = await relay.start()
    try:
        yield relay, relayed
    finally:
        await relay.cut()


async def test_a_command_that_times_out_fails_alone_while_the_others_go_on(
    services: Services, connect_leases: ConnectLeases
) -> None:
    """One acquire gets no answer: it alone fails (LeaseUnavailable, after the timeout),
    while lease commands of the same manager, in flight on its other connections all along,
    keep getting theirs; afterwards the manager works as before."""
    stuck_name = f"stuck-{uuid.uuid4().hex}"
    async with _muting(services.redis_url, stuck_name) as (relay, url):
        leases = connect_leases(url, prefix=_prefix())
        held = await leases.acquire("held")  # opens a connection before the muting
        assert held is not None
        stuck = asyncio.create_task(leases.acquire(stuck_name))
        await relay.muted.wait()
        done: list[int] = []

        async def meanwhile(worker: int) -> None:
            while not stuck.done():
                lease = await leases.acquire(f"meanwhile-{worker}")
                assert lease is not None
                assert await leases.holder("held") == held.token
                assert await leases.release(lease) is True
                done.append(worker)

        async with asyncio.timeout(PROMPT):
            await asyncio.gather(*(meanwhile(w) for w in range(4)))
            with pytest.raises(LeaseUnavailable) as caught:
                await stuck
        assert isinstance(caught.value.__cause__, redis_errors.TimeoutError)
        assert len(done) >= 4  # every worker went round at least once while it hung
        extended = await leases.extend(held)
        assert extended is not None
        assert await leases.release(extended) is True


async def test_a_cancelled_command_leaves_the_client_answering_in_step(
    services: Services, redis: Redis, connect_leases: ConnectLeases
) -> None:
    """A request cancelled while its command waits for Redis: its connection is dropped with
    its late answer, and the next commands get their own answers."""
    prefix = _prefix()
    hung = f"hung-{uuid.uuid4().hex}"
    async with _muting(services.redis_url, hung) as (relay, url):
        leases = connect_leases(url, prefix=prefix)
        waiting = asyncio.create_task(leases.holder(hung))
        await relay.muted.wait()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        tokens = {}
        for name in ("a", "b", "c"):
            lease = await leases.acquire(name)
            assert lease is not None
            tokens[name] = lease.token
        for name, token in tokens.items():
            assert await leases.holder(name) == token
            assert await redis.get(prefix + name) == token.encode()


async def test_concurrent_commands_each_get_their_own_answer_past_the_pool_size(
    services: Services,
) -> None:
    """300 concurrent take/extend/check/release rounds over a pool of 4 connections: the
    commands wait for a connection (none fails for want of one) and each gets its own
    answer."""
    settings = Settings.from_env({}, redis_timeout=PROMPT, redis_lease_connections=4)
    client = make_lease_redis(settings, services.redis_url)
    leases = LeaseManager(client, ttl=30.0, timeout=PROMPT, prefix=_prefix())

    async def one(i: int) -> None:
        lease = await leases.acquire(str(i))
        assert lease is not None
        assert await leases.extend(lease) is not None
        assert await leases.holder(str(i)) == lease.token
        assert await leases.release(lease) is True

    try:
        await asyncio.gather(*(one(i) for i in range(300)))
    finally:
        await client.aclose()


async def test_a_script_redis_lost_is_loaded_again(leases: LeaseManager, redis: Redis) -> None:
    """After SCRIPT FLUSH (as after a restart of Redis) extend and release still work."""
    held = await leases.acquire("one")
    assert held is not None
    assert await leases.extend(held) is not None  # the extend script is loaded now
    await redis.script_flush()
    extended = await leases.extend(held)
    assert extended is not None
    assert await leases.release(extended) is True
    assert await leases.holder("one") is None


async def test_the_lease_client_authenticates_and_selects_its_database(
    services: Services, connect_redis: Callable[[str], Redis], connect_leases: ConnectLeases
) -> None:
    """The suite's Redis asks for a password; database 3 is not database 0."""
    url = services.redis_url.rsplit("/", 1)[0] + "/3"
    prefix = _prefix()
    leases = connect_leases(url, prefix=prefix)
    held = await leases.acquire("one")
    assert held is not None
    assert await connect_redis(url).get(prefix + "one") == held.token.encode()
    assert await connect_redis(services.redis_url).get(prefix + "one") is None
    assert await leases.release(held) is True

    wrong = services.redis_url.replace("://:", "://:wrong", 1)
    if wrong == services.redis_url:
        pytest.skip("this Redis asks for no password (SETTLEMENT_REDIS_URL without one)")
    with pytest.raises(LeaseUnavailable) as caught:
        await connect_leases(wrong).acquire("one")
    assert isinstance(caught.value.__cause__, redis_errors.AuthenticationError)


@asynccontextmanager
async def _server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object],
) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on a free port running ``handle`` per connection: its URL and a list
    that counts connections."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await handle(reader, writer)  # type: ignore[misc]

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0", accepted
    finally:
        server.close()


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"-LOADING Redis is loading the dataset in memory", redis_errors.BusyLoadingError),
        (b"-ERR max number of clients reached", redis_errors.ConnectionError),
        (b"-READONLY You can't write against a read only replica.", redis_errors.ReadOnlyError),
        (
            b"-OOM command not allowed when used memory > 'maxmemory'.",
            redis_errors.OutOfMemoryError,
        ),
        (
            b"-WRONGTYPE Operation against a key holding the wrong kind of value",
            redis_errors.ResponseError,
        ),
    ],
)
async def test_every_error_reply_leaves_no_lease(
    connect_leases: ConnectLeases, reply: bytes, error: type[Exception]
) -> None:
    """Each error reply as redis-py raises it; for a lease every one is "unavailable"."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write((reply + b"\r\n") * data.count(b"*"))  # one answer per command
        writer.close()

    async with _server(refuse) as (url, _):
        with pytest.raises(LeaseUnavailable) as caught:
            await connect_leases(url).acquire("refused")
        assert isinstance(caught.value.__cause__, error)


async def test_a_server_that_hangs_up_is_unavailable_and_the_next_command_reconnects(
    connect_leases: ConnectLeases,
) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        writer.close()

    async with _server(hang_up) as (url, accepted):
        leases = connect_leases(url)
        for attempt in (1, 2):
            with pytest.raises(LeaseUnavailable) as caught:
                await leases.acquire("one")
            assert isinstance(caught.value.__cause__, redis_errors.ConnectionError)
            assert len(accepted) == attempt


def test_leases_over_uvloop(services: Services) -> None:
    """The server's event loop is uvloop."""
    import uvloop

    async def take_and_release() -> None:
        settings = Settings.from_env({}, redis_timeout=PROMPT)
        client = make_lease_redis(settings, services.redis_url)
        leases = LeaseManager(client, ttl=1.0, timeout=PROMPT, prefix=_prefix())
        try:
            lease = await leases.acquire("one")
            assert lease is not None
            assert await leases.acquire("one") is None
            assert await leases.extend(lease) is not None
            assert await leases.release(lease, announce=f"test:{uuid.uuid4().hex}")
            assert await leases.acquire("one") is not None
        finally:
            await client.aclose()

    uvloop.run(take_and_release())


@contextmanager
def _traced() -> Iterator[InMemorySpanExporter]:
    """Redis client spans into memory, from the instrumentor ``SETTLEMENT_OTEL_EXPORTER``
    turns on, for the duration of the block."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = RedisInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()


async def test_every_lease_command_is_a_redis_client_span(
    services: Services, connect_leases: ConnectLeases
) -> None:
    leases = connect_leases(services.redis_url, prefix=_prefix())
    warm = await leases.acquire("warm")  # Redis has both scripts from here on
    assert warm is not None
    assert await leases.extend(warm) is not None
    assert await leases.release(warm) is True
    with _traced() as exporter:
        lease = await leases.acquire("one")
        assert lease is not None
        extended = await leases.extend(lease)
        assert extended is not None
        assert await leases.holder("one") == lease.token
        assert await leases.release(extended) is True
        spans = exporter.get_finished_spans()
    assert [span.name for span in spans] == ["SET", "EVALSHA", "GET", "EVALSHA"]
    for span in spans:
        assert span.kind is SpanKind.CLIENT
        assert span.attributes is not None
        assert span.attributes["db.system"] == "redis"
        assert lease.token not in str(span.attributes)  # arguments are not recorded
