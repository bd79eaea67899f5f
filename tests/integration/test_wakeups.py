"""Wake-ups of ``Prefer: wait`` over real Redis pub/sub (service/leases/wakeups.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from service.leases import Wakeups

pytestmark = pytest.mark.integration


async def test_an_announcement_wakes_a_subscribed_waiter(redis: Redis) -> None:
    wakeups = Wakeups(redis, prefix=f"test:{uuid.uuid4().hex}:")
    async with wakeups.wait_for("op-1") as wait:
        assert wait is not None
        woken = asyncio.create_task(wait(5.0))
        await asyncio.sleep(0.05)
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
