"""Redis leases: "a worker is alive on this operation". Liveness, never safety.

A lease is one Redis key holding a random token, set with ``SET NX PX``. Only the holder of
the token may extend or release it (compare-and-extend, compare-and-delete Lua scripts). A
:class:`Heartbeat` extends the lease in the background while the work runs and sets ``lost``
once the lease can no longer be assumed to be ours.

Every command goes through redis-py's asyncio client (``execute_command``; the scripts by
EVALSHA of a redis-py ``Script`` from ``register_script``, sent whole by EVAL to a node that
lacks it), so each is a Redis client span when tracing is on. Each is bounded as a whole (waiting
for a pooled connection, connecting, sending, reading) by the manager's ``timeout``; when it
runs out only that command fails, and only its connection is dropped: the pool's other
connections, and the commands on them, go on (:func:`service.leases.make_lease_redis`).

Losing a lease costs availability only: the fencing token checked in PostgreSQL at commit
time is what stops a stale worker. Nothing here is read as authority for a decision.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, TypeVar, cast

from redis import exceptions as redis_errors
from redis.commands.core import AsyncScript

from service.errors import SettlementError
from service.leases.client import AnyRedis, LeaseRedis

T = TypeVar("T")

__all__ = ["DEFAULT_PREFIX", "Heartbeat", "Lease", "LeaseManager", "LeaseUnavailable"]

log = logging.getLogger("settlement.leases")

# Every lease key lives under this prefix, so leases can be listed and never collide.
DEFAULT_PREFIX = "settlement:lease:"
# How long each cancel of the heartbeat task is given to land before it is repeated.
STOP_GRACE = 0.1

# Extend every ttl/3: two beats in a row may fail and a third still lands before expiry.
BEAT_FRACTION = 1 / 3

# Bytes of randomness in a lease token: unguessable, so no other worker can forge ownership.
TOKEN_BYTES = 16

# Redis refusing to serve a write (unreachable, timed out, failed over to a read-only replica,
# out of memory) means the same for a lease: it cannot be taken or kept right now.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    OSError,
    # any other error reply to a lease's command: the lease store misbehaves, so no lease
    redis_errors.ResponseError,
    # a cluster whose slots the client cannot place (no node serves the key's slot, or the
    # topology cannot be read): no lease either
    redis_errors.ClusterError,
    redis_errors.RedisClusterException,
)

# KEYS[1] lease key, ARGV[1] token, ARGV[2] ttl in ms -> 1 if extended, 0 if not ours.
_EXTEND = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
"""

# KEYS[1] lease key, ARGV[1] token, ARGV[2] (optional) a channel to publish "1" on, whether
# or not the lease was still ours -> 1 if deleted, 0 if not ours.
_RELEASE = """
local released = 0
if redis.call("GET", KEYS[1]) == ARGV[1] then
    released = redis.call("DEL", KEYS[1])
end
if ARGV[2] then
    redis.call("PUBLISH", ARGV[2], "1")
end
return released
"""


class LeaseUnavailable(SettlementError):
    """Redis is unreachable or timed out: no new execution without a lease (fail closed)."""

    problem = "lease-unavailable"


@dataclass(frozen=True, slots=True)
class Lease:
    """One held lease. ``expires_at`` is local wall-clock time, informational only."""

    key: str
    token: str
    ttl: float
    expires_at: float


class LeaseManager:
    """Takes, extends and releases leases under ``prefix`` on one Redis client: the server's
    is :func:`service.leases.make_lease_redis`'s, a pool of the leases' own."""

    def __init__(
        self,
        redis: LeaseRedis,
        *,
        ttl: float,
        timeout: float,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.time,
        events: Callable[[str], None] | None = None,
    ) -> None:
        """``timeout`` bounds each command as a whole (``SETTLEMENT_REDIS_TIMEOUT``).
        ``events`` is told ``acquired``, ``lost`` (a heartbeat gave the lease up) and
        ``heartbeat_failed`` (an extend failed and is retried): the metrics."""
        if not math.isfinite(ttl) or _ms(ttl) < 1:
            raise ValueError(f"lease ttl must be a finite number of at least 1 ms, got {ttl!r}")
        if not math.isfinite(timeout) or timeout <= 0:
            raise ValueError(f"lease timeout must be a finite number > 0, got {timeout!r}")
        self._redis = redis
        self._ttl = ttl
        self._timeout = timeout
        self._prefix = prefix
        self._clock = clock
        self._events = events or _ignore
        # each call is an EVALSHA, an EVAL where Redis lacks the script (_run)
        self._extend = redis.register_script(_EXTEND)
        self._release = redis.register_script(_RELEASE)

    @property
    def ttl(self) -> float:
        return self._ttl

    def now(self) -> float:
        """The clock that stamps ``Lease.expires_at``."""
        return self._clock()

    def report(self, event: str) -> None:
        """Tell ``events`` about a heartbeat's ``lost`` or ``heartbeat_failed``."""
        self._events(event)

    async def acquire(self, name: str) -> Lease | None:
        """Take the lease on ``name``; None when another holder has it."""
        key = self._prefix + name
        token = secrets.token_hex(TOKEN_BYTES)
        # read before the call: Redis starts the ttl later, so expires_at errs early
        started = self._clock()
        ms = _ms(self._ttl)

        def command(client: AnyRedis) -> Awaitable[Any]:
            # execute_command, not set(): the same command without set()'s option parsing
            return client.execute_command("SET", key, token, "NX", "PX", ms)

        acquired = await self._bounded("acquire", key, command)
        if not acquired:
            return None
        self._events("acquired")
        return Lease(key=key, token=token, ttl=self._ttl, expires_at=started + self._ttl)

    async def extend(self, lease: Lease) -> Lease | None:
        """Push the expiry one ttl ahead if the lease is still ours; None when it is lost."""
        started = self._clock()
        keys = [lease.key]
        args: list[bytes | str | int] = [lease.token, _ms(lease.ttl)]
        extended = await self._bounded(
            "extend", lease.key, lambda client: _run(client, self._extend, keys, args)
        )
        if extended != 1:
            return None
        return replace(lease, expires_at=started + lease.ttl)

    async def release(self, lease: Lease, *, announce: str | None = None) -> bool:
        """Delete the lease if it is still ours; False when it had expired or changed hands.
        ``announce``: a channel to publish on in the same round trip (a settlement's
        wake-up, :meth:`service.leases.Wakeups.deferred`)."""
        args: list[bytes | str | int] = [lease.token]
        if announce is not None:
            args.append(announce)
        keys = [lease.key]
        released = await self._bounded(
            "release", lease.key, lambda client: _run(client, self._release, keys, args)
        )
        return bool(released == 1)

    async def _bounded(
        self, action: str, key: str, command: Callable[[AnyRedis], Awaitable[T]]
    ) -> T:
        """``command``'s answer, on a client of its own, within ``timeout``; LeaseUnavailable
        when Redis cannot give it. On timeout the command is cancelled: redis-py drops its
        connection (its answer may still come), and its client reconnects at its next."""
        try:
            async with asyncio.timeout(self._timeout):
                return await self._redis.call(command)
        except TimeoutError:  # asyncio.timeout's (an OSError too, so caught first)
            late = redis_errors.TimeoutError(f"Redis did not answer within {self._timeout}s")
            raise LeaseUnavailable(
                f"cannot {action} lease {key}: Redis unavailable ({late!r})"
            ) from late
        except _UNAVAILABLE as exc:
            raise LeaseUnavailable(
                f"cannot {action} lease {key}: Redis unavailable ({exc!r})"
            ) from exc

    async def remaining_many(self, names: list[str]) -> list[float | None]:
        """Seconds each named lease has left (None where free): one PTTL per lease, sent
        at once (each lease key may live on a node of its own)."""
        return list(await asyncio.gather(*(self.remaining(name) for name in names)))

    async def revoke(self, name: str) -> bool:
        """Delete the lease whoever holds it (an admin fenced its attempt out in PostgreSQL).
        The holder's next heartbeat finds it gone and stops its work."""
        key = self._prefix + name
        return bool(await self._bounded("revoke", key, lambda client: client.delete(key)))

    async def holder(self, name: str) -> str | None:
        """The token currently holding ``name``, or None when nobody does."""
        key = self._prefix + name
        token = await self._bounded("read", key, lambda client: client.get(key))
        if token is None:
            return None
        return token.decode() if isinstance(token, bytes) else str(token)

    async def remaining(self, name: str) -> float | None:
        """Seconds until the lease on ``name`` expires, or None when nobody holds it."""
        key = self._prefix + name
        pttl = int(await self._bounded("read", key, lambda client: client.pttl(key)))
        return _seconds_left(pttl)

    def heartbeat(
        self,
        lease: Lease,
        *,
        on_lost: Callable[[], object] | None = None,
        before_extend: Callable[[], Awaitable[None]] | None = None,
    ) -> Heartbeat:
        """Keep ``lease`` alive while the ``async with`` body runs; see :class:`Heartbeat`.

        ``before_extend`` runs before each extend, inside its time budget (a failpoint hook).
        """
        return Heartbeat(self, lease, on_lost=on_lost, before_extend=before_extend)


class Heartbeat:
    """Extends a lease every ttl/3 in a background task while the ``async with`` body runs.

    ``lost`` is set, and ``on_lost`` called once, when an extend finds the lease gone (expired
    or held by another token) or when no extend has succeeded for a whole ttl (Redis
    unreachable: the lease must be assumed gone). Extends then stop. Leaving the block stops
    the task; it does not release the lease, the caller does that after settlement.
    """

    def __init__(
        self,
        manager: LeaseManager,
        lease: Lease,
        *,
        on_lost: Callable[[], object] | None = None,
        before_extend: Callable[[], Awaitable[None]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._manager = manager
        self._lease = lease
        self._on_lost = on_lost
        self._before_extend = before_extend
        self._monotonic = monotonic
        self._interval = lease.ttl * BEAT_FRACTION
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # monotonic time by which the lease must be assumed expired, and of the next extend
        self._deadline = 0.0
        self._next_beat = 0.0
        self.lost = asyncio.Event()

    @property
    def lease(self) -> Lease:
        """The latest lease, with the expiry of the last successful extend."""
        return self._lease

    async def __aenter__(self) -> Heartbeat:
        if self._task is not None:
            raise RuntimeError("a heartbeat can be entered only once")
        now = self._monotonic()
        # never trust more than one ttl, even if the wall clock stepped back since the extend
        left = min(self._lease.ttl, self._lease.expires_at - self._manager.now())
        self._deadline = now + left
        # one interval after the lease was last set: immediately if it was taken long ago
        self._next_beat = self._deadline - self._lease.ttl + self._interval
        self._task = asyncio.create_task(self._run(), name=f"lease-heartbeat {self._lease.key}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        # A cancellation that lands as an extend's own timeout fires can be swallowed by
        # asyncio.timeout (Python 3.11): keep cancelling until the task has really ended.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_GRACE)
        if not task.cancelled() and task.exception() is not None:
            log.error("lease heartbeat ended with %r", task.exception())

    async def _run(self) -> None:
        try:
            while not self._stopping:
                await asyncio.sleep(self._delay())
                if not await self._beat():
                    return
        except Exception:
            # a bug here must not leave the work running on a lease nobody extends
            log.exception("lease heartbeat failed", extra={"lease_key": self._lease.key})
            self._mark_lost("heartbeat failed")

    def _delay(self) -> float:
        # never sleep past the deadline: that is when the lease must be given up
        return max(0.0, min(self._next_beat, self._deadline) - self._monotonic())

    async def _beat(self) -> bool:
        """One extend; False once the lease is lost and the heartbeat should stop."""
        started = self._monotonic()
        budget = self._deadline - started
        if budget <= 0:
            self._mark_lost("no extend succeeded within its ttl")
            return False
        self._next_beat = started + self._interval
        try:
            # an extend answered after the deadline is too late to keep the lease
            async with asyncio.timeout(budget):
                if self._before_extend is not None:
                    await self._before_extend()
                renewed = await self._manager.extend(self._lease)
        except (LeaseUnavailable, redis_errors.RedisError, TimeoutError) as exc:
            self._manager.report("heartbeat_failed")
            if self._monotonic() >= self._deadline:
                self._mark_lost("no extend succeeded within its ttl")
                return False
            log.warning(
                "lease %s not extended, retrying: %r",
                self._lease.key,
                exc,
                extra={"lease_key": self._lease.key},
            )
            return True
        if renewed is None:
            self._mark_lost("expired or taken by another holder")
            return False
        self._lease = renewed
        # Redis started the new ttl after we sent the extend, so this errs early
        self._deadline = started + renewed.ttl
        return True

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return
        self.lost.set()
        self._manager.report("lost")
        log.warning(
            "lease %s lost: %s",
            self._lease.key,
            reason,
            extra={"lease_key": self._lease.key, "reason": reason},
        )
        if self._on_lost is not None:
            try:
                self._on_lost()
            except Exception:
                log.exception("on_lost callback failed", extra={"lease_key": self._lease.key})


def _ignore(event: str) -> None:
    return None


async def _run(
    client: AnyRedis, script: AsyncScript, keys: list[str], args: list[bytes | str | int]
) -> Any:
    """``script`` by EVALSHA; by EVAL (which also caches it there) on NOSCRIPT. Not the
    ``Script``'s own call: it reloads with SCRIPT LOAD, which a cluster client sends to every
    master, so one master down would fail the commands on the others."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except redis_errors.NoScriptError:
        source = cast(str, script.script)  # registered from a str
        return await client.eval(source, len(keys), *keys, *args)


def _seconds_left(pttl: int) -> float | None:
    if pttl == -2:  # no such key
        return None
    if pttl == -1:  # a key without expiry was not written by acquire; it never frees itself
        return math.inf
    return pttl / 1000


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
