"""Leases, heartbeats, wake-ups and outages on a local Redis Cluster (three masters, one
replica each, devstack.EmbeddedRedisCluster), and the failover of one master."""

from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import pytest
import redis
from redis.asyncio import RedisCluster

from devstack import EmbeddedRedisCluster
from service.app.root import Settlement
from service.config import Settings
from service.leases import (
    AnyRedis,
    LeaseManager,
    LeaseUnavailable,
    Wakeups,
    make_lease_redis,
    make_redis,
)

pytestmark = pytest.mark.integration

# Anything expected "promptly" on a loaded machine.
PROMPT = 5.0
# The lease commands' timeout: a dead master's slots answer LeaseUnavailable after it.
TIMEOUT = 0.5
# The file's lease ttl: heartbeats are seen within a second.
TTL = 0.6
# A failover takes the node timeout (1 s) and an election; this bounds it on a loaded machine.
FAILOVER = 30.0
# A new client's first answer (slots read, connections opened) on a loaded machine.
STARTUP = 10.0

Open = Callable[..., Awaitable[LeaseManager]]
T = TypeVar("T")


def _cluster() -> Iterator[EmbeddedRedisCluster]:
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-cluster-"))
    cluster = EmbeddedRedisCluster(data_dir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedRedisCluster]:
    """One cluster for the file's tests that fail no node."""
    yield from _cluster()


@pytest.fixture
def own_cluster() -> Iterator[EmbeddedRedisCluster]:
    """A cluster of the test's own: it kills a node."""
    yield from _cluster()


@pytest.fixture
async def open_leases() -> AsyncIterator[Open]:
    """``await open(url, ttl=..., prefix=..., warm=True)``: a lease manager on the lease
    client of ``url``, as the server makes it, its slots read unless ``warm`` is false; the
    clients are closed when the test ends."""
    made = []

    async def open_(
        url: str, *, ttl: float = TTL, prefix: str = "test:", warm: bool = True
    ) -> LeaseManager:
        settings = Settings.from_env({}, redis_url=url, redis_timeout=TIMEOUT)
        made.append(make_lease_redis(settings, url))
        leases = LeaseManager(made[-1], ttl=ttl, timeout=TIMEOUT, prefix=prefix)
        # A new client's first command also reads the cluster's slots and connects, which a
        # loaded machine can take past TIMEOUT: warm it first, as a running server's is.
        if warm:
            await _answered(lambda: leases.holder("warm-up"), within=STARTUP)
        return leases

    yield open_
    for client in made:
        await client.aclose()


@pytest.fixture
async def shared() -> AsyncIterator[Callable[[str], AnyRedis]]:
    """``shared(url)``: the server's shared client (pub/sub, health) for ``url``."""
    made: list[AnyRedis] = []

    def open_(url: str) -> AnyRedis:
        made.append(make_redis(Settings.from_env({}, redis_timeout=TIMEOUT), url))
        return made[-1]

    yield open_
    for client in made:
        await client.aclose()


def _names_on_every_master(cluster: EmbeddedRedisCluster, prefix: str) -> dict[int, str]:
    """A lease name per master: the master's port -> a name whose key it serves."""
    found: dict[int, str] = {}
    for i in range(1000):
        port = cluster.master_port(f"{prefix}n{i}")
        found.setdefault(port, f"n{i}")
        if len(found) == 3:  # the cluster's masters
            return found
    raise AssertionError("the keys did not reach every master")


async def test_leases_are_taken_held_and_released_on_every_master(
    cluster: EmbeddedRedisCluster, open_leases: Open
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    leases = await open_leases(cluster.url, ttl=30.0, prefix=prefix)
    rival = await open_leases(cluster.url, ttl=30.0, prefix=prefix)
    for name in _names_on_every_master(cluster, prefix).values():
        held = await leases.acquire(name)
        assert held is not None
        assert await rival.acquire(name) is None
        assert await rival.holder(name) == held.token
        extended = await leases.extend(held)
        assert extended is not None
        assert await rival.remaining_many([name, "free"]) == [pytest.approx(30.0, abs=2), None]
        assert await leases.release(extended) is True
        assert await rival.acquire(name) is not None


async def test_a_heartbeat_keeps_its_lease_and_notices_a_stolen_one(
    cluster: EmbeddedRedisCluster, open_leases: Open
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    leases = await open_leases(cluster.url, prefix=prefix)
    rival = await open_leases(cluster.url, prefix=prefix)
    held = await leases.acquire("one")
    assert held is not None
    async with leases.heartbeat(held) as beat:
        for _ in range(12):  # 1.2 s, two ttls: without the heartbeat the rival would take it
            await asyncio.sleep(0.1)
            assert await rival.acquire("one") is None
        assert not beat.lost.is_set()
        assert await rival.revoke("one") is True  # as an admin fencing the attempt out
        stolen = await rival.acquire("one")
        assert stolen is not None
        async with asyncio.timeout(PROMPT):
            await beat.lost.wait()
    assert await rival.holder("one") == stolen.token


async def test_a_release_wakes_a_waiter_subscribed_through_any_node(
    cluster: EmbeddedRedisCluster, open_leases: Open, shared: Callable[[str], AnyRedis]
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    wakeups = Wakeups(shared(cluster.url), prefix=prefix)
    leases = await open_leases(cluster.url, ttl=30.0, prefix=prefix + "lease:")
    for name in _names_on_every_master(cluster, prefix + "lease:").values():
        lease = await leases.acquire(name)
        assert lease is not None
        async with wakeups.wait_for(f"op-{name}") as wait:
            assert wait is not None
            assert await leases.release(lease, announce=f"{prefix}op-{name}") is True
            assert await wait(PROMPT) is True
    wakeups.announce("op-plain")  # a plain PUBLISH, in the background
    await wakeups.close()


def _dead_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_url_naming_several_nodes_reaches_the_cluster_past_a_dead_one(
    cluster: EmbeddedRedisCluster, open_leases: Open
) -> None:
    credentials, _, nodes = cluster.url.partition("@")
    first_dead = f"{credentials}@127.0.0.1:{_dead_port()},{nodes}"
    leases = await open_leases(first_dead, prefix=f"test:{uuid.uuid4().hex}:")
    held = await leases.acquire("one")
    assert held is not None
    assert await leases.release(held) is True


async def test_a_warmed_lease_client_has_read_the_slots_and_one_of_no_node_says_so(
    cluster: EmbeddedRedisCluster,
) -> None:
    """``LeaseRedis.warm``, which ``Settlement.open`` calls: the slots are read before the
    first request; an unreachable cluster makes it answer False within its bound, not hang."""
    settings = Settings.from_env({}, redis_url=cluster.url, redis_timeout=TIMEOUT)
    client = make_lease_redis(settings, cluster.url)
    try:
        masters = await client.call(_masters)
        assert masters == []  # nothing read yet
        assert await client.warm(STARTUP) is True
        assert len(await client.call(_masters)) == 3
    finally:
        await client.aclose()
    dead = f"redis+cluster://127.0.0.1:{_dead_port()}"
    client = make_lease_redis(settings, dead)
    try:
        async with asyncio.timeout(PROMPT):
            assert await client.warm(TIMEOUT) is False
    finally:
        await client.aclose()


async def test_a_server_whose_cluster_does_not_answer_starts_and_says_so(
    migrated_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``Settlement.open`` warms the lease client; with no node answering it logs a warning
    within its bound and starts all the same (requests get 503 until a node is back)."""
    dead = f"redis+cluster://127.0.0.1:{_dead_port()}"
    settings = Settings.from_env(
        {}, database_url=migrated_url, redis_url=dead, redis_timeout=TIMEOUT
    )
    with caplog.at_level(logging.WARNING, logger="settlement.leases"):
        async with asyncio.timeout(PROMPT):
            settlement = await Settlement.open(settings, background=False)
    try:
        warned = [r.getMessage() for r in caplog.records if r.name == "settlement.leases"]
        assert warned == [
            "the Redis Cluster's slots could not be read at start; the first lease command "
            "reads them"
        ]
    finally:
        await settlement.close()


async def _masters(client: AnyRedis) -> list[object]:
    assert isinstance(client, RedisCluster)
    return list(client.get_primaries())


async def test_an_unreachable_cluster_is_unavailable_promptly(open_leases: Open) -> None:
    leases = await open_leases(f"redis+cluster://127.0.0.1:{_dead_port()}", warm=False)
    async with asyncio.timeout(PROMPT):
        with pytest.raises(LeaseUnavailable):
            await leases.acquire("one")
        with pytest.raises(LeaseUnavailable):
            await leases.remaining("one")


async def test_a_master_failing_over_keeps_its_replicated_leases_and_fails_closed_meanwhile(
    own_cluster: EmbeddedRedisCluster, open_leases: Open
) -> None:
    """A master is killed. Its slots answer LeaseUnavailable (no lease is handed out twice)
    until its replica has taken over; the other masters' leases keep working throughout;
    after the failover the replica holds the lease the master held, so nobody else can
    take it."""
    cluster = own_cluster
    prefix = f"test:{uuid.uuid4().hex}:"
    leases = await open_leases(cluster.url, ttl=60.0, prefix=prefix)
    rival = await open_leases(cluster.url, ttl=60.0, prefix=prefix)
    names = _names_on_every_master(cluster, prefix)
    doomed, *others = names
    held = await leases.acquire(names[doomed])
    assert held is not None
    # the rival has read the slots too, as a running server has
    assert await rival.holder(names[doomed]) == held.token
    (replica,) = cluster.replica_ports(doomed)
    password = urlsplit(cluster.url).password
    copy = redis.Redis(
        host="127.0.0.1",
        port=replica,
        password=password,
        socket_timeout=PROMPT,
        single_connection_client=True,  # READONLY holds for its connection
    )
    try:
        copy.execute_command("READONLY")
        async with asyncio.timeout(PROMPT):  # replicated (asynchronously): poll the replica
            while True:
                if copy.execute_command("GET", held.key) == held.token.encode():
                    break
                await asyncio.sleep(0.01)
    finally:
        copy.close()

    cluster.kill(doomed)
    with pytest.raises(LeaseUnavailable):
        await rival.acquire(names[doomed])
    for port in others:  # the other masters are not touched
        other = await rival.acquire(names[port])
        assert other is not None
        assert await rival.release(other) is True

    answer = await _after_failover(lambda: rival.acquire(names[doomed]))
    assert answer is None  # the replica has the lease: still the first holder's
    assert await rival.holder(names[doomed]) == held.token
    # the holder's client has not seen the failover yet: its first command there may fail
    extended = await _after_failover(lambda: leases.extend(held))
    assert extended is not None
    assert await leases.release(extended) is True
    assert await rival.acquire(names[doomed]) is not None


async def _after_failover(call: Callable[[], Awaitable[T]]) -> T:
    """``call``'s answer once it stops failing with LeaseUnavailable: a slot of a dead
    master fails closed until its replica has taken over and the client has read the slots
    again."""
    return await _answered(call, within=FAILOVER)


async def _answered(call: Callable[[], Awaitable[T]], *, within: float) -> T:
    """``call``'s answer once it stops failing with LeaseUnavailable, within ``within`` s."""
    async with asyncio.timeout(within):
        while True:
            try:
                return await call()
            except LeaseUnavailable:
                await asyncio.sleep(0.1)  # not failed over yet: ask again
