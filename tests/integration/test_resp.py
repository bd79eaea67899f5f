"""The leases' pipelined Redis connection (service.leases.resp) against a real Redis, and
against servers that never answer or hang up."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, closing

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from service.config import Settings
from service.leases import LeaseManager, LeaseUnavailable, make_redis
from service.leases.resp import Pipelined, Script, pipelined_for
from tests.conftest import Services

pytestmark = pytest.mark.integration

# Anything expected "promptly" on a loaded machine.
PROMPT = 5.0
# The timeout of the clients that talk to servers that never answer.
SHORT = 0.3


@pytest.fixture
def pipelined(redis: Redis) -> Pipelined:
    made = pipelined_for(redis)
    assert made is not None
    return made


async def test_answers_reach_their_callers_in_order(pipelined: Pipelined, redis: Redis) -> None:
    """300 concurrent commands share one connection; each gets its own answer."""
    prefix = f"test:{uuid.uuid4().hex}:"

    async def one(i: int) -> None:
        assert await pipelined.call(b"SET", f"{prefix}{i}", i) == b"OK"
        assert await pipelined.call(b"GET", f"{prefix}{i}") == str(i).encode()
        assert await pipelined.call(b"INCRBY", f"{prefix}{i}", i) == 2 * i

    await asyncio.gather(*(one(i) for i in range(300)))
    assert await redis.get(f"{prefix}299") == b"598"
    pipelined.close()


async def test_error_replies_raise_redis_py_errors(pipelined: Pipelined) -> None:
    with pytest.raises(redis_errors.ResponseError, match="unknown command"):
        await pipelined.call(b"NO-SUCH-COMMAND")
    with pytest.raises(redis_errors.NoScriptError):
        await pipelined.call(b"EVALSHA", b"0" * 40, 0)
    key = f"test:{uuid.uuid4().hex}"
    await pipelined.call(b"SET", key, b"text")
    with pytest.raises(redis_errors.ResponseError, match="not an integer"):
        await pipelined.call(b"INCR", key)
    # the connection is still in step after errors
    assert await pipelined.call(b"PING") == b"PONG"
    pipelined.close()


async def test_a_script_redis_lacks_is_sent_whole(pipelined: Pipelined, redis: Redis) -> None:
    script = Script(f"return '{uuid.uuid4().hex}'")
    assert await redis.script_exists(script.sha.decode()) == [False]
    first = await script(pipelined, [], [])
    assert await redis.script_exists(script.sha.decode()) == [True]
    assert await script(pipelined, [], []) == first
    pipelined.close()


async def test_a_cancelled_caller_leaves_the_answers_in_step(
    pipelined: Pipelined, redis: Redis
) -> None:
    """A caller cancelled while Redis works on its command: its late answer is dropped, and
    the next command still gets its own."""
    key = f"test:{uuid.uuid4().hex}"
    blocked = asyncio.create_task(pipelined.call(b"BLPOP", key, b"0.1"))
    await asyncio.sleep(0.02)
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert await pipelined.call(b"ECHO", b"mine") == b"mine"
    pipelined.close()


async def test_the_connection_authenticates_and_selects_its_database(
    services: Services, connect_redis: Callable[[str], Redis]
) -> None:
    """The suite's Redis asks for a password; database 3 is not database 0."""
    url = services.redis_url.rsplit("/", 1)[0] + "/3"
    client = connect_redis(url)
    pipelined = pipelined_for(client)
    assert pipelined is not None
    key = f"test:{uuid.uuid4().hex}"
    await pipelined.call(b"SET", key, b"3")
    assert await client.get(key) == b"3"
    assert await connect_redis(services.redis_url).get(key) is None
    pipelined.close()

    wrong = services.redis_url.replace("://:", "://:wrong", 1)
    if wrong == services.redis_url:
        pytest.skip("this Redis asks for no password (SETTLEMENT_REDIS_URL without one)")
    refused = pipelined_for(connect_redis(wrong))
    assert refused is not None
    with pytest.raises(redis_errors.AuthenticationError):
        await refused.call(b"PING")


@asynccontextmanager
async def _server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object],
) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP server on a free port running ``handle`` per connection; the port and a list
    that counts connections."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await handle(reader, writer)  # type: ignore[misc]

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port, accepted
    finally:
        server.close()


async def test_a_silent_server_times_out_and_the_next_call_reconnects() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):  # until the client gives up and hangs up
            pass
        writer.close()

    async with _server(silent) as (port, accepted):
        pipelined = Pipelined(("127.0.0.1", port), timeout=SHORT, connect_timeout=SHORT)
        for attempt in (1, 2):
            started = time.monotonic()
            waiting = [asyncio.create_task(pipelined.call(b"PING")) for _ in range(3)]
            for task in waiting:
                with pytest.raises(redis_errors.TimeoutError):
                    await task
            assert time.monotonic() - started < PROMPT
            assert len(accepted) == attempt
        pipelined.close()


async def test_a_server_that_hangs_up_fails_the_waiting_calls() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        writer.close()

    async with _server(hang_up) as (port, accepted):
        pipelined = Pipelined(("127.0.0.1", port), timeout=PROMPT, connect_timeout=PROMPT)
        with pytest.raises(redis_errors.ConnectionError):
            await pipelined.call(b"PING")
        with pytest.raises(redis_errors.ConnectionError):
            await pipelined.call(b"PING")
        assert len(accepted) == 2


async def test_a_reply_nobody_asked_for_drops_the_connection() -> None:
    async def chatty(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):
            writer.write(b"+PONG\r\n+EXTRA\r\n")
        writer.close()

    async with _server(chatty) as (port, accepted):
        pipelined = Pipelined(("127.0.0.1", port), timeout=PROMPT, connect_timeout=PROMPT)
        assert await pipelined.call(b"PING") == b"PONG"
        await asyncio.sleep(0.05)  # the extra reply arrives: the connection is dropped
        assert await pipelined.call(b"PING") == b"PONG"
        assert len(accepted) == 2  # the second command went over a new connection
        pipelined.close()


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
async def test_error_replies_are_redis_py_s_and_leave_no_lease(
    reply: bytes, error: type[Exception]
) -> None:
    """Each error reply as redis-py raises it; for a lease, every one is "unavailable"."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(1 << 16):
            writer.write(reply + b"\r\n")
        writer.close()

    async with _server(refuse) as (port, _):
        pipelined = Pipelined(("127.0.0.1", port), timeout=PROMPT, connect_timeout=PROMPT)
        with pytest.raises(error):
            await pipelined.call(b"SET", b"k", b"v")
        pipelined.close()
        await _no_lease_from(port, PROMPT)


async def test_a_caller_cancelled_while_connecting_leaves_the_others_waiting() -> None:
    """The connect is shared: cancelling the caller that started it cancels only that
    caller's wait; the others get their answers once the handshake is done."""
    answer = asyncio.Event()

    async def slow_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer.wait()
        while data := await reader.read(1 << 16):
            writer.write(b"+PONG\r\n" * data.count(b"*"))  # one answer per command, AUTH too
        writer.close()

    async with _server(slow_handshake) as (port, _):
        pipelined = Pipelined(
            ("127.0.0.1", port), timeout=PROMPT, connect_timeout=PROMPT, password="pw"
        )
        first = asyncio.create_task(pipelined.call(b"PING"))
        second = asyncio.create_task(pipelined.call(b"PING"))
        await asyncio.sleep(0.05)
        first.cancel()
        answer.set()
        assert await asyncio.wait_for(second, PROMPT) == b"PONG"
        with pytest.raises(asyncio.CancelledError):
            await first
        pipelined.close()


def _dead_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _no_lease_from(port: int, redis_timeout: float) -> None:
    """A lease manager on the Redis at ``port`` answers LeaseUnavailable."""
    settings = Settings.from_env({}, redis_timeout=redis_timeout)
    client = make_redis(settings, f"redis://127.0.0.1:{port}/0")
    leases = LeaseManager(client, ttl=1.0)
    with pytest.raises(LeaseUnavailable):
        await leases.acquire("refused")
    leases.close()
    await client.aclose()


async def test_nobody_listening_is_a_connection_error() -> None:
    pipelined = Pipelined(("127.0.0.1", _dead_port()), timeout=SHORT, connect_timeout=SHORT)
    with pytest.raises(redis_errors.ConnectionError):
        await pipelined.call(b"PING")


async def test_a_lease_on_an_unreachable_redis_is_unavailable() -> None:
    await _no_lease_from(_dead_port(), SHORT)


def test_leases_over_uvloop(services: Services) -> None:
    """The server's event loop is uvloop, whose transports are its own classes."""
    import uvloop

    async def take_and_release() -> None:
        settings = Settings.from_env({}, redis_timeout=PROMPT)
        client = make_redis(settings, services.redis_url)
        leases = LeaseManager(client, ttl=1.0, prefix=f"test:{uuid.uuid4().hex}:")
        lease = await leases.acquire("one")
        assert lease is not None
        assert await leases.acquire("one") is None
        assert await leases.extend(lease) is not None
        assert await leases.release(lease, announce=f"test:{uuid.uuid4().hex}")
        assert await leases.acquire("one") is not None
        leases.close()
        await client.aclose()

    uvloop.run(take_and_release())


def test_clients_it_cannot_speak_for_keep_redis_py() -> None:
    settings = Settings.from_env({}, redis_timeout=SHORT)
    assert pipelined_for(make_redis(settings, "rediss://127.0.0.1:6380/0")) is None
    assert pipelined_for(Redis.from_url("redis://127.0.0.1:6379/0")) is None  # no timeout
    unix = pipelined_for(make_redis(settings, "unix:///tmp/redis.sock?db=2"))
    assert unix is not None
