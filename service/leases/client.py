"""The Redis client: every call bounded by the socket timeouts of the settings."""

from __future__ import annotations

from redis.asyncio import Redis

from service.config import Settings

__all__ = ["make_redis", "ping"]


def make_redis(settings: Settings, url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_timeout=settings.redis_timeout,
        socket_connect_timeout=settings.redis_timeout,
        health_check_interval=30,
        decode_responses=False,
    )


async def ping(client: Redis) -> None:
    await client.ping()
