"""Health: is each dependency answering now? The database (the only authority) and Redis
(liveness), each asked once and bounded by ``SETTLEMENT_HEALTH_TIMEOUT``.

HTTP decides what the answers mean for ``/health`` and ``/readyz``; a failure's reason goes
to the log here, never to the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from service.leases import AnyRedis
from service.leases import ping as redis_ping
from service.store.db import ping as database_ping

__all__ = ["Dependencies", "DependencyState", "HealthChecks"]

log = logging.getLogger("settlement.health")

DependencyState = Literal["ok", "timeout", "unavailable"]


class Dependencies(msgspec.Struct, frozen=True):
    """What each dependency answered."""

    database: DependencyState
    redis: DependencyState


class HealthChecks:
    def __init__(self, reader: AsyncEngine, redis: AnyRedis, *, timeout: float) -> None:
        """``reader``: the engine's single-statement reads; ``timeout``: each check's bound."""
        self._reader = reader
        self._redis = redis
        self._timeout = timeout

    async def check(self) -> Dependencies:
        """Both dependencies, asked at once."""
        database, redis = await asyncio.gather(
            _check("database", lambda: database_ping(self._reader), self._timeout),
            _check("redis", lambda: redis_ping(self._redis), self._timeout),
        )
        return Dependencies(database=database, redis=redis)


async def _check(name: str, probe: Callable[[], Awaitable[None]], limit: float) -> DependencyState:
    try:
        async with asyncio.timeout(limit):
            await probe()
    except TimeoutError:
        log.warning("health check timed out", extra={"dependency": name, "timeout": limit})
        return "timeout"
    except Exception as exc:  # any failure means "down"; the reason goes to the log
        log.warning("health check failed", extra={"dependency": name, "error": repr(exc)})
        return "unavailable"
    return "ok"
