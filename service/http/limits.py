"""A deadline for the request body: the one limit on a slow client that the server leaves to us.

The HTTP server caps the header block, its count and its time, and the connections per worker
(``service.serving``); the body limit in bytes is Litestar's (``SETTLEMENT_BODY_LIMIT``). What
is left is time: a client that sends its headers, then the body a byte at a time (or not at
all), would hold a connection and a worker's request slot for as long as it likes. Here every
read of the body must end by ``SETTLEMENT_BODY_TIMEOUT`` after the request arrived; past it the
read raises ``ProblemError("request-timeout")``, which Litestar's exception handlers answer
(408, problem+json) like any other refusal before anything was stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from service.http.problems import ProblemError

__all__ = ["BodyDeadline"]

# ASGI's shapes, plainly (Litestar's TypedDicts make a receive wrapper's type a union to narrow)
Message = MutableMapping[str, Any]
ASGIApp = Callable[..., Awaitable[None]]


class BodyDeadline:
    """ASGI middleware: the request body must arrive within ``timeout`` seconds of the request."""

    def __init__(self, app: ASGIApp, timeout: float) -> None:
        self.app = app
        self.timeout = timeout

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.timeout
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:  # after the body: a wait for the client's disconnect, not timed
                later: Message = await receive()
                return later
            try:
                async with asyncio.timeout_at(deadline):
                    message: Message = await receive()
            except TimeoutError:
                body_done = True
                raise ProblemError(
                    "request-timeout",
                    f"the request body did not arrive within {self.timeout:g} s of its headers",
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        await self.app(scope, timed_receive, send)
