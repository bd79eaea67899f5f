"""Redis leases and heartbeats against a real Redis: liveness that fails closed."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, closing

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis

from service.config import Settings
from service.leases import Heartbeat, Lease, LeaseManager, LeaseUnavailable, make_lease_redis
from service.problem_types import problem_type
from tests.conftest import Services
from tests.integration.redis_relay import RedisRelay

pytestmark = pytest.mark.integration

# Generous bound on anything expected "promptly", so a loaded machine does not fail the suite.
PROMPT = 5.0
# Lease of the tests that wait on heartbeats: short, so the whole file stays a few seconds.
TTL = 0.6

Connect = Callable[[str], Redis]
ConnectLeases = Callable[..., LeaseManager]


def _name() -> str:
    return f"test:{uuid.uuid4().hex}"


@pytest.fixture
def leases(services: Services, connect_leases: ConnectLeases) -> LeaseManager:
    """The shared manager with this file's short ttl, so heartbeats are seen within a second."""
    return connect_leases(services.redis_url, ttl=TTL)


def _free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _steal(redis: Redis, lease: Lease, token: str = "thief") -> None:
    await redis.delete(lease.key)
    await redis.set(lease.key, token, px=5_000)


async def _a_beat(beat: Heartbeat, lease: Lease) -> None:
    """Until ``beat`` has extended ``lease`` once (its expiry moved on); fail after PROMPT."""
    deadline = asyncio.get_running_loop().time() + PROMPT
    while beat.lease.expires_at <= lease.expires_at:
        assert asyncio.get_running_loop().time() < deadline, "the heartbeat never extended"
        await asyncio.sleep(0.01)


def _no_pending_tasks() -> bool:
    return asyncio.all_tasks() == {asyncio.current_task()}


class _LogSignal(logging.Handler):
    """Fires when the leases logger emits a record containing ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self._text = text
        self.fired = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self._text in record.getMessage():
            self.fired.set()

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[None]:
        logger = logging.getLogger("settlement.leases")
        logger.addHandler(self)
        try:
            yield
        finally:
            logger.removeHandler(self)


@pytest.fixture(autouse=True)
def _no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No "Task was destroyed but it is pending", no unhandled task exceptions."""
    yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


async def test_held_lease_cannot_be_acquired_until_released(leases: LeaseManager) -> None:
    name = _name()
    first = await leases.acquire(name)
    assert first is not None
    assert await leases.holder(name) == first.token
    assert await leases.acquire(name) is None

    assert await leases.release(first) is True
    assert await leases.holder(name) is None
    assert await leases.remaining(name) is None

    second = await leases.acquire(name)
    assert second is not None
    assert second.token != first.token
    await leases.release(second)


async def test_release_with_a_wrong_token_keeps_the_holders_lease(leases: LeaseManager) -> None:
    name = _name()
    held = await leases.acquire(name)
    assert held is not None
    forged = Lease(key=held.key, token="not-the-token", ttl=held.ttl, expires_at=0.0)

    assert await leases.release(forged) is False
    assert await leases.holder(name) == held.token
    await leases.release(held)


async def test_extend_with_a_wrong_token_returns_none_and_does_not_extend(
    services: Services, connect_leases: ConnectLeases
) -> None:
    name = _name()
    leases = connect_leases(services.redis_url, ttl=1.0)
    held = await leases.acquire(name)
    assert held is not None
    await asyncio.sleep(0.3)  # time itself: the lease's remaining ttl must shrink
    forged = Lease(key=held.key, token="not-the-token", ttl=held.ttl, expires_at=0.0)

    assert await leases.extend(forged) is None
    left = await leases.remaining(name)
    assert left is not None and left <= 0.7  # at least 0.3 s of the 1 s went by
    assert await leases.holder(name) == held.token

    extended = await leases.extend(held)
    assert extended is not None
    assert extended.token == held.token
    assert extended.expires_at > held.expires_at
    left = await leases.remaining(name)
    assert left is not None and left > 0.7
    await leases.release(extended)


async def test_lease_expires_after_its_ttl_without_heartbeats(
    services: Services, connect_leases: ConnectLeases
) -> None:
    name = _name()
    leases = connect_leases(services.redis_url, ttl=0.3)
    stale = await leases.acquire(name)
    assert stale is not None
    await asyncio.sleep(0.45)  # time itself: the 0.3 s ttl must run out

    fresh = await leases.acquire(name)
    assert fresh is not None
    assert await leases.extend(stale) is None
    assert await leases.release(stale) is False
    assert await leases.holder(name) == fresh.token
    await leases.release(fresh)


async def test_heartbeat_keeps_a_lease_alive_well_beyond_its_ttl(
    services: Services, connect_leases: ConnectLeases
) -> None:
    name = _name()
    leases = connect_leases(services.redis_url, ttl=0.3)
    rival = connect_leases(services.redis_url, ttl=0.3)
    held = await leases.acquire(name)
    assert held is not None
    async with leases.heartbeat(held) as beat:
        for _ in range(12):  # 1.2 s, four ttls
            await asyncio.sleep(0.1)
            assert await rival.acquire(name) is None
        assert not beat.lost.is_set()
        assert beat.lease.token == held.token
        assert beat.lease.expires_at > held.expires_at

    # leaving the block stops the heartbeat but does not release the lease
    assert await leases.holder(name) == held.token
    assert await leases.release(beat.lease) is True


async def test_heartbeat_notices_a_stolen_lease_at_its_next_beat(
    leases: LeaseManager, redis: Redis
) -> None:
    name = _name()
    calls: list[None] = []
    held = await leases.acquire(name)
    assert held is not None
    async with leases.heartbeat(held, on_lost=lambda: calls.append(None)) as beat:
        await _steal(redis, held)
        # the thief's key lives 5 s, so only the compare-and-extend can notice
        async with asyncio.timeout(TTL + 0.4):  # one interval is TTL / 3
            await beat.lost.wait()
        await asyncio.sleep(TTL)  # more beats would have happened by now
    assert len(calls) == 1
    assert await leases.holder(name) == "thief"


async def test_on_lost_can_cancel_the_work_holding_the_lease(
    leases: LeaseManager, redis: Redis
) -> None:
    name = _name()
    held = await leases.acquire(name)
    assert held is not None
    started = asyncio.Event()

    async def work() -> None:
        handler = asyncio.current_task()
        assert handler is not None
        async with leases.heartbeat(held, on_lost=handler.cancel):
            started.set()
            await asyncio.sleep(PROMPT * 10)  # the work: runs until on_lost cancels it

    task = asyncio.create_task(work())
    await started.wait()
    await _steal(redis, held)
    async with asyncio.timeout(PROMPT):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _no_pending_tasks()


async def test_heartbeat_gives_the_lease_up_when_redis_stays_unreachable_for_a_ttl(
    services: Services, leases: LeaseManager, connect_leases: ConnectLeases
) -> None:
    name = _name()
    calls: list[None] = []
    relay = RedisRelay(services.redis_url)
    failed_beat = _LogSignal("not extended")
    relayed = connect_leases(await relay.start(), ttl=TTL)
    async with failed_beat.watch():
        held = await relayed.acquire(name)
        assert held is not None
        async with relayed.heartbeat(held, on_lost=lambda: calls.append(None)) as beat:
            await _a_beat(beat, held)  # a good beat first
            assert not beat.lost.is_set()
            await relay.cut()

            # a failed beat is retried: the lease is kept until a ttl passes without one
            async with asyncio.timeout(PROMPT):
                await failed_beat.fired.wait()
            assert not beat.lost.is_set()
            async with asyncio.timeout(PROMPT):
                await beat.lost.wait()
        assert len(calls) == 1
        with pytest.raises(LeaseUnavailable):
            await relayed.acquire(name)

    # nobody extended it after the cut, so Redis lets it expire too
    left = await leases.remaining(name)
    assert left is None or left <= TTL
    await asyncio.sleep((left or 0.0) + 0.05)  # time itself: what was left of the ttl runs out
    assert await leases.holder(name) is None


async def test_unreachable_redis_raises_lease_unavailable_promptly(
    connect_leases: ConnectLeases,
) -> None:
    leases = connect_leases(f"redis://127.0.0.1:{_free_port()}/0", ttl=TTL)
    lease = Lease(key="settlement:lease:x", token="t", ttl=TTL, expires_at=0.0)
    async with asyncio.timeout(PROMPT):
        with pytest.raises(LeaseUnavailable) as caught:
            await leases.acquire(_name())
        assert isinstance(caught.value.__cause__, redis_errors.ConnectionError)
        assert problem_type(caught.value.problem).status == 503
        with pytest.raises(LeaseUnavailable):
            await leases.extend(lease)
        with pytest.raises(LeaseUnavailable):
            await leases.release(lease)
        with pytest.raises(LeaseUnavailable):
            await leases.holder(_name())
        with pytest.raises(LeaseUnavailable):
            await leases.remaining(_name())


async def test_redis_that_never_answers_raises_lease_unavailable_after_its_timeout(
    connect_leases: ConnectLeases,
) -> None:
    # accepts connections (the kernel queues them) but never reads or answers
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        leases = connect_leases(url, ttl=TTL)
        async with asyncio.timeout(PROMPT):
            with pytest.raises(LeaseUnavailable) as caught:
                await leases.acquire(_name())
        assert isinstance(caught.value.__cause__, redis_errors.TimeoutError)


async def test_leaving_the_heartbeat_leaves_no_pending_tasks(
    leases: LeaseManager, redis: Redis
) -> None:
    held = await leases.acquire(_name())
    assert held is not None
    async with leases.heartbeat(held) as beat:
        await _a_beat(beat, held)  # the heartbeat is running between its beats
        assert not _no_pending_tasks()
    assert _no_pending_tasks()
    assert not beat.lost.is_set()

    # also when the body fails, and when the heartbeat had already stopped on loss
    with pytest.raises(RuntimeError, match="boom"):
        async with leases.heartbeat(beat.lease):
            raise RuntimeError("boom")
    assert _no_pending_tasks()

    await _steal(redis, beat.lease)
    async with leases.heartbeat(beat.lease) as lost:
        async with asyncio.timeout(PROMPT):
            await lost.lost.wait()
    assert _no_pending_tasks()


async def test_lease_ttl_and_timeout_must_be_finite_and_positive() -> None:
    redis = make_lease_redis(Settings.from_env({}), "redis://127.0.0.1:1/0")  # never used
    for ttl in (0.0, -1.0, 0.0004, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ttl"):
            LeaseManager(redis, ttl=ttl, timeout=1.0)
    for timeout in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            LeaseManager(redis, ttl=1.0, timeout=timeout)
