"""The Redis clients: every call bounded by the timeout of the settings.

``make_redis`` is the process's shared client (pub/sub waits, status reads, health checks,
the sweeper's reads): redis-py's socket timeouts bound each call. ``make_lease_redis`` is the
lease commands' own (every request's acquire and release, the heartbeats' extends), bounded
per command by :class:`service.leases.LeaseManager`.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from service.config import Settings

__all__ = ["make_lease_redis", "make_redis", "ping"]


def make_redis(settings: Settings, url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_timeout=settings.redis_timeout,
        socket_connect_timeout=settings.redis_timeout,
        health_check_interval=30,
        decode_responses=False,
    )


def make_lease_redis(settings: Settings, url: str) -> Redis:
    """The lease commands' client: a pool of ``SETTLEMENT_REDIS_LEASE_CONNECTIONS``
    connections of their own, one command on a connection at a time.

    * **A pool of its own**, so the shared client's long holders (a ``Prefer: wait``
      subscription keeps a connection up to ``SETTLEMENT_MAX_WAIT``, up to
      ``wakeups.MAX_WAITERS`` of them) never leave a lease command without a connection.
    * **One command per connection** (redis-py's pool): a command that times out drops its
      own connection only; the commands in flight on the others are not touched. Not
      ``single_connection_client``: that runs one command at a time for the whole process,
      behind a lock, so one slow answer would hold up every lease command.
    * **Blocking**, at most ``SETTLEMENT_REDIS_LEASE_CONNECTIONS`` connections: past that a
      command waits for a connection to come back instead of failing (a burst of requests
      queues for a few round trips rather than getting 503s), and one process never opens
      more. The wait counts against the command's timeout.
    * **No socket timeout**: the lease manager bounds each command as a whole, wait for a
      connection included, with one timer (``asyncio.timeout``); a redis-py socket timeout
      would add a timer for the read and a task for every write (``asyncio.wait_for`` on
      Python 3.11). The connect keeps its own timeout.
    * **No retries**: a retried ``SET NX`` whose first answer was lost finds its own key
      and reports the lease as taken by another; a failed command fails, and the request
      answers 503 ``lease-unavailable``.
    * **No health-check PING**: taking a connection from the pool already replaces one that
      Redis closed (a restart); a PING first would add a round trip and, without retries,
      fail the command just the same when it goes unanswered.
    """
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=settings.redis_lease_connections,
        timeout=None,  # the lease manager's timeout bounds the wait
        socket_timeout=None,
        socket_connect_timeout=settings.redis_timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
    )
    return Redis.from_pool(pool)


async def ping(client: Redis) -> None:
    await client.ping()
