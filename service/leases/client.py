"""The Redis clients: every call bounded by the timeout of the settings.

``make_redis`` is the process's shared client (pub/sub waits, health checks): redis-py's
socket timeouts bound each call. ``make_lease_redis`` is the lease commands' own (every
request's acquire and release, the heartbeats' extends, the sweeper's and the status reads'
PTTLs), bounded per command by :class:`service.leases.LeaseManager`.

A URL whose scheme is ``redis+cluster`` (``rediss+cluster`` with TLS) names nodes of a Redis
Cluster (one, or several comma-separated): both are then redis-py cluster clients, which
read the slots from the first of those nodes that answers, find the other nodes, and follow
the slots as they move (a failover included).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, RedisError

from service.config import Settings

__all__ = ["CLUSTER_SCHEMES", "AnyRedis", "LeaseRedis", "make_lease_redis", "make_redis", "ping"]

T = TypeVar("T")

# One Redis or a Redis Cluster: the commands used here are the same on both.
AnyRedis: TypeAlias = Redis | RedisCluster

# The URL of a Redis Cluster: a node's URL with "+cluster" after the scheme; more nodes may
# follow the first, comma-separated (host1:port1,host2:port2).
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _cluster(url: str, **options: Any) -> RedisCluster | None:
    """A redis-py cluster client for a Redis Cluster URL, None for a URL of one Redis."""
    scheme, separator, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    if plain is None or not separator:
        return None
    parts = urlsplit(f"{plain}://{rest}")
    credentials, at, hosts = parts.netloc.rpartition("@")
    first, *more = hosts.split(",")
    nodes = []
    for node in more:
        host, _, port = node.rpartition(":")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    first_url = urlunsplit(parts._replace(netloc=f"{credentials}{at}{first}"))
    return RedisCluster.from_url(first_url, startup_nodes=nodes, **options)


def make_redis(settings: Settings, url: str) -> AnyRedis:
    options: dict[str, Any] = {
        "socket_timeout": settings.redis_timeout,
        "socket_connect_timeout": settings.redis_timeout,
        "health_check_interval": 30,
        "decode_responses": False,
    }
    cluster = _cluster(url, **options)
    return cluster if cluster is not None else Redis.from_url(url, **options)


class LeaseRedis:
    """The lease commands' Redis: ``SETTLEMENT_REDIS_LEASE_CONNECTIONS`` redis-py clients of
    one connection each (``single_connection_client``), each lent to one command at a time.

    * **Apart from the shared client**, so its long holders (a ``Prefer: wait``
      subscription keeps a connection up to ``SETTLEMENT_MAX_WAIT``, up to
      ``wakeups.MAX_WAITERS`` of them) never leave a lease command without a connection.
    * **One command per connection**: a command that times out drops its own connection
      only; the commands in flight on the others are not touched, and the client it was
      lent reconnects at its next command. Not one ``single_connection_client`` for the
      process: that runs one command at a time behind a lock, so one slow answer would hold
      up every lease command.
    * **Single-connection clients lent out, not redis-py's pool**: a client that owns its
      connection skips the pool's checkout and return (its lock, its bookkeeping, its
      readiness check), which is a fifth of a lease command's client CPU
      (``bench/lease_cost.py``); lending a client is a semaphore and a list pop.
    * **At most ``SETTLEMENT_REDIS_LEASE_CONNECTIONS``**: past them a command waits for a
      client to come back instead of failing (a burst of requests queues for a few round
      trips rather than getting 503s), and one process never opens more. A client opens
      its connection at its first command, so a quiet process holds few. The wait counts
      against the command's timeout.
    * **No socket timeout**: the lease manager bounds each command as a whole, the wait
      for a client included, with one timer (``asyncio.timeout``); a redis-py socket
      timeout would add a timer for the read and a task for every write
      (``asyncio.wait_for`` on Python 3.11). The connect keeps its own timeout.
    * **No retries**: a retried ``SET NX`` whose first answer was lost finds its own key
      and reports the lease as taken by another; a failed command fails, and the request
      answers 503 ``lease-unavailable``.
    * **No health-check PING**: a command on a connection Redis closed (a restart) fails
      once and the next reconnects; a PING first would add a round trip and, without
      retries, fail the command just the same when it goes unanswered.

    On a Redis Cluster (``redis+cluster://``) there is one redis-py cluster client, lent to
    up to ``SETTLEMENT_REDIS_LEASE_CONNECTIONS`` commands at once: it keeps a pool of that
    many connections per node, one command per connection, and sends each command to the
    master of its key's slot. Without retries, a command to a master that died fails
    (503) and makes the client read the slots again; once the replica has taken over,
    commands go to it.
    """

    def __init__(self, settings: Settings, url: str) -> None:
        size = settings.redis_lease_connections
        options: dict[str, Any] = {
            "socket_timeout": None,
            "socket_connect_timeout": settings.redis_timeout,
            "retry": Retry(NoBackoff(), 0),
            "decode_responses": False,
        }
        self._pool: ConnectionPool | None = None
        self._clients: tuple[AnyRedis, ...]
        cluster = _cluster(url, max_connections=size, **options)
        if cluster is None:
            self._pool = ConnectionPool.from_url(url, max_connections=size, **options)
            self._clients = tuple(
                Redis(connection_pool=self._pool, single_connection_client=True)
                for _ in range(size)
            )
            self._idle = list(self._clients)
        else:
            self._clients = (cluster,)
            self._idle = list(self._clients * size)
        self._free = asyncio.Semaphore(size)

    def register_script(self, source: str) -> AsyncScript:
        """A Lua script to call with ``client=`` one of the clients :meth:`call` lends."""
        return self._clients[0].register_script(source)

    async def call(self, command: Callable[[AnyRedis], Awaitable[T]]) -> T:
        """``command`` run on a client of its own (waiting for one while all are lent)."""
        async with self._free:
            client = self._idle.pop()
            try:
                return await command(client)
            finally:
                self._idle.append(client)

    async def warm(self, within: float) -> bool:
        """On a Redis Cluster, read its slots now, so that the first requests' lease commands
        do not pay for it within their timeout; True once read (at once for one Redis, whose
        connections open with their first commands). False if no node answered within
        ``within`` s: the first lease command reads them instead."""
        if self._pool is not None:
            return True
        cluster = self._clients[0]
        assert isinstance(cluster, RedisCluster)
        try:
            async with asyncio.timeout(within):
                await cluster.initialize()
        except (RedisError, RedisClusterException, OSError, TimeoutError):
            return False
        return True

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
        if self._pool is not None:
            await self._pool.aclose()


def make_lease_redis(settings: Settings, url: str) -> LeaseRedis:
    """The lease commands' clients (:class:`LeaseRedis`) for the Redis at ``url``."""
    return LeaseRedis(settings, url)


async def ping(client: AnyRedis) -> None:
    await client.ping()
