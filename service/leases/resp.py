"""The leases' hot commands on one pipelined Redis connection per process.

A new operation takes a lease and releases it: two commands per request. Through redis-py's
client each costs about 190 Python calls (its retry wrapper, connection pool, observability
hooks and a task for every socket timeout); here it is a packed write and a future answered
in order by hiredis' parser. Everything else (reads for the status resource, pub/sub, admin
revocations) stays on redis-py.

Commands from concurrent requests share the connection (Redis answers them in the order they
were sent). Every command is bounded by the client's socket timeout: when one runs out the
connection is dropped, every command waiting on it fails with ``ConnectionError`` (the lease
layer's "Redis unavailable"), and the next command connects anew (bounded by the connect
timeout). The errors raised are redis-py's, so callers handle one set of exceptions.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections import deque
from typing import Any, cast

import hiredis
from redis import exceptions as redis_errors
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection

__all__ = ["Pipelined", "Script", "pipelined_for"]


def _error(message: str) -> Exception:
    """An error reply as redis-py's exception for it (``LOADING`` is a ConnectionError,
    ``NOSCRIPT`` a NoScriptError, a wrong password an AuthenticationError, ...)."""
    error: Exception = BaseParser.parse_error(message)  # type: ignore[no-untyped-call]
    return error


def _pack(args: tuple[bytes | str | int, ...]) -> bytes:
    """One RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class _Protocol(asyncio.Protocol):
    """One connection: answers go to the waiting futures in the order commands were sent."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.closed = False
        self._reader = hiredis.Reader(replyError=_error)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                self.abort(redis_errors.ConnectionError(f"Redis protocol error: {exc}"))
                return
            if reply is False:
                return
            if not self.waiting:  # an answer nobody asked for: the stream is out of step
                self.abort(redis_errors.ConnectionError("Redis sent an unexpected reply"))
                return
            future = self.waiting.popleft()
            if not future.done():  # a caller that gave up has been cancelled
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(redis_errors.ConnectionError(f"Redis connection lost ({exc!r})"))

    def abort(self, error: redis_errors.RedisError) -> None:
        """Drop the connection: every waiting command fails with ``error``."""
        if self.transport is not None:
            self.transport.abort()
        self._fail(error)

    def _fail(self, error: redis_errors.RedisError) -> None:
        self.closed = True
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class Pipelined:
    """A process's pipelined connection to the Redis at ``address`` (host and port, or a
    Unix socket path): :meth:`call` sends one command and waits for its answer."""

    def __init__(
        self,
        address: tuple[str, int] | str,
        *,
        timeout: float,
        connect_timeout: float,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self._address = address
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._hello: list[tuple[bytes | str | int, ...]] = []
        if password is not None:
            auth = ("AUTH", password) if username is None else ("AUTH", username, password)
            self._hello.append(auth)
        if db:
            self._hello.append(("SELECT", db))
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None
        self._closes = 0  # close() calls: a connect begun before one is not kept

    async def call(self, *args: bytes | str | int) -> Any:
        """The answer to one command; redis-py's exceptions on failure."""
        protocol = self._protocol
        loop = asyncio.get_running_loop()
        if protocol is None or protocol.closed or loop is not self._loop:
            protocol = await self._connect(loop)
        return await self._send(loop, protocol, args, self._timeout)

    @staticmethod
    async def _send(
        loop: asyncio.AbstractEventLoop,
        protocol: _Protocol,
        args: tuple[bytes | str | int, ...],
        timeout: float,  # noqa: ASYNC109 (a timer per command, cheaper than a Timeout)
    ) -> Any:
        if protocol.closed or protocol.transport is None:  # lost since it was opened
            raise redis_errors.ConnectionError("Redis connection lost")
        future = loop.create_future()
        protocol.waiting.append(future)
        protocol.transport.write(_pack(args))
        timer = loop.call_later(timeout, _expire, protocol, future, timeout)
        try:
            reply = await future
        finally:
            timer.cancel()
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        """The connection, opened once for every caller that needs it: by a task of its own,
        so a caller cancelled meanwhile cancels only its own wait."""
        connecting = self._connecting
        if connecting is None or self._loop is not loop:
            if self._protocol is not None:
                self._protocol.abort(redis_errors.ConnectionError("reconnecting"))
            self._loop = loop
            self._protocol = None
            connecting = self._connecting = loop.create_task(self._open(loop))
            closes = self._closes
            connecting.add_done_callback(lambda task: self._opened(task, loop, closes))
        try:
            return await asyncio.shield(connecting)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if connecting.cancelled() and (current is None or not current.cancelling()):
                # close() stopped the connect; this caller was not cancelled
                raise redis_errors.ConnectionError("closed while connecting") from None
            raise

    def _opened(
        self, task: asyncio.Task[_Protocol], loop: asyncio.AbstractEventLoop, closes: int
    ) -> None:
        if self._connecting is task:
            self._connecting = None
        if task.cancelled() or task.exception() is not None:  # retrieved: nobody may wait
            return
        protocol = task.result()
        if self._loop is loop and self._closes == closes:
            self._protocol = protocol
        else:  # closed, or another loop took over, meanwhile
            protocol.abort(redis_errors.ConnectionError("client closed"))

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        try:
            async with asyncio.timeout(self._connect_timeout):
                if isinstance(self._address, str):
                    _, protocol = await loop.create_unix_connection(_Protocol, self._address)
                else:
                    host, port = self._address
                    _, protocol = await loop.create_connection(_Protocol, host, port)
        except TimeoutError:
            raise redis_errors.TimeoutError(
                f"connecting to Redis took over {self._connect_timeout}s"
            ) from None
        except OSError as exc:
            raise redis_errors.ConnectionError(f"cannot connect to Redis: {exc}") from exc
        for command in self._hello:
            try:
                await self._send(loop, protocol, command, self._timeout)
            except BaseException:
                protocol.abort(redis_errors.ConnectionError("handshake failed"))
                raise
        return protocol

    def close(self) -> None:
        """Drop the connection (commands still waiting fail) and stop a connect in progress;
        a later call connects anew."""
        self._closes += 1
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        if self._protocol is not None:
            self._protocol.abort(redis_errors.ConnectionError("client closed"))
            self._protocol = None


def _expire(protocol: _Protocol, future: asyncio.Future[Any], timeout: float) -> None:
    if not future.done():
        protocol.abort(redis_errors.TimeoutError(f"Redis did not answer within {timeout}s"))


class Script:
    """A Lua script run by its SHA-1 (EVALSHA), sent whole (EVAL) when Redis lacks it."""

    def __init__(self, source: str) -> None:
        self.source = source.encode()
        self.sha = hashlib.sha1(self.source).hexdigest().encode()  # the id Redis gives a script

    async def __call__(
        self, redis: Pipelined, keys: list[str], args: list[bytes | str | int]
    ) -> Any:
        try:
            return await redis.call(b"EVALSHA", self.sha, len(keys), *keys, *args)
        except redis_errors.NoScriptError:
            return await redis.call(b"EVAL", self.source, len(keys), *keys, *args)


def pipelined_for(client: Redis) -> Pipelined | None:
    """A pipelined connection to the Redis ``client`` talks to, with its timeouts and
    credentials; None for a connection this module does not speak (TLS, for one)."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    timeout = kwargs.get("socket_timeout")
    connect_timeout = kwargs.get("socket_connect_timeout") or timeout
    if timeout is None or connect_timeout is None:
        return None  # every call here is bounded; an unbounded client keeps redis-py
    address: tuple[str, int] | str
    if pool.connection_class is UnixDomainSocketConnection:
        address = kwargs["path"]
    elif pool.connection_class is Connection:
        address = (kwargs.get("host", "localhost"), int(kwargs.get("port", 6379)))
    else:
        return None
    return Pipelined(
        address,
        timeout=float(timeout),
        connect_timeout=float(connect_timeout),
        db=int(kwargs.get("db", 0) or 0),
        username=kwargs.get("username"),
        password=kwargs.get("password"),
    )
