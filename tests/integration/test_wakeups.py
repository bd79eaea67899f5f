"""Wake-ups of ``Prefer: wait`` over real Redis pub/sub (service/leases/wakeups.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from service.leases import LeaseManager, Wakeups
from tests.conftest import Services

pytestmark = pytest.mark.integration

ConnectLeases = Callable[..., LeaseManager]


async def test_an_announcement_wakes_a_subscribed_waiter(redis: Redis) -> None:
    wakeups = Wakeups(redis, prefix=f"test:{uuid.uuid4().hex}:")
    async with wakeups.wait_for("op-1") as wait:
        assert wait is not None
        # no barrier needed: wait_for confirmed the subscription on entry, so from here on an
        # announcement reaches wait() whether or not it is reading yet
        woken = asyncio.create_task(wait(5.0))
        wakeups.announce("op-1")
        assert await asyncio.wait_for(woken, 5.0) is True
    await wakeups.close()


async def test_another_operation_does_not_wake_and_the_wait_keeps_its_deadline(
    redis: Redis,
) -> None:
    wakeups = Wakeups(redis, prefix=f"test:{uuid.uuid4().hex}:")
    async with wakeups.wait_for("op-1") as wait:
        assert wait is not None
        wakeups.announce("op-2")
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await wait(0.6) is False
        assert loop.time() - started >= 0.55
    await wakeups.close()


async def test_without_redis_there_is_no_wait_and_no_error(
    connect_redis: object,
) -> None:
    dead = connect_redis("redis://127.0.0.1:1/0")  # type: ignore[operator]
    wakeups = Wakeups(dead)
    async with wakeups.wait_for("op-1") as wait:
        assert wait is None  # the caller answers at once; nothing raised
    wakeups.announce("op-1")  # a hint: a failed publish is logged, not raised
    await wakeups.close()


async def test_an_announcement_under_a_held_lease_rides_with_its_release(
    redis: Redis, services: Services, connect_leases: ConnectLeases
) -> None:
    """While an attempt holds the operation's lease the wake-up is held back, then sent by the
    release's own script: a waiter is woken by the release, not before it."""
    prefix = f"test:{uuid.uuid4().hex}:"
    wakeups = Wakeups(redis, prefix=prefix)
    leases = connect_leases(services.redis_url, ttl=5.0, prefix=prefix + "lease:")
    lease = await leases.acquire("scope-1")
    assert lease is not None
    async with wakeups.wait_for("op-1") as wait:
        assert wait is not None
        with wakeups.deferred("op-1") as announced:
            wakeups.announce("op-1")  # the settlement's commit, as the store's hook does
            assert await wait(0.3) is False  # held back
            channel = announced()
            assert channel == prefix + "op-1"
            assert await leases.release(lease, announce=channel) is True
        assert await wait(5.0) is True
        # taken, so nothing more is published on leaving the block
        assert await wait(0.3) is False
    assert await leases.holder("scope-1") is None
    await wakeups.close()


async def test_a_held_back_announcement_not_taken_is_published_on_leaving(redis: Redis) -> None:
    wakeups = Wakeups(redis, prefix=f"test:{uuid.uuid4().hex}:")
    async with wakeups.wait_for("op-1") as wait:
        assert wait is not None
        with wakeups.deferred("op-1") as announced:
            assert announced() is None  # nothing announced yet: nothing to send
            wakeups.announce("op-1")
        assert await wait(5.0) is True
    await wakeups.close()


async def test_a_release_announces_even_when_the_lease_is_no_longer_ours(
    redis: Redis, services: Services, connect_leases: ConnectLeases
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    wakeups = Wakeups(redis, prefix=prefix)
    leases = connect_leases(services.redis_url, ttl=5.0, prefix=prefix + "lease:")
    lease = await leases.acquire("scope-1")
    assert lease is not None
    assert await leases.revoke("scope-1")
    async with wakeups.wait_for("op-1") as wait:
        assert wait is not None
        assert await leases.release(lease, announce=prefix + "op-1") is False
        assert await wait(5.0) is True
    await wakeups.close()
