"""An idempotent route's answer before it is a Litestar ``Response``, and the request it reads.

The idempotent routes build a :class:`Reply`: status, media type, body and headers. Litestar's
router gets it as a ``Response`` (:func:`to_response`); the idempotent lane
(:mod:`service.http.lane`) sends it as the two ASGI messages Litestar would send
(:func:`send_reply`), header for header. The request side is :class:`Call`: what these routes
read of a request (two header lookups and the body), which Litestar's ``Request`` and the
lane's own request both are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec
from litestar import Response

__all__ = ["LANE_ANSWER", "Call", "Headers", "Reply", "send_reply", "to_response"]

# The key, in an idempotent route's Litestar ``opt``, of the route's answer function
# ``(call, settlement) -> Reply``: what its handler calls, and what the lane calls instead.
LANE_ANSWER = "lane_answer"


class Headers(Protocol):
    """A request's headers, names case-insensitive."""

    def get(self, key: str, /) -> str | None:
        """The first value of ``key``, or None."""

    def getall(self, key: str, default: list[str], /) -> list[str]:
        """Every value of ``key`` in order, or ``default``."""


class Call(Protocol):
    """What an idempotent route reads of its request."""

    @property
    def headers(self) -> Headers: ...

    async def body(self) -> bytes:
        """The whole body, within the route's limit (413 past it)."""


class Reply(msgspec.Struct):
    """A response: its headers are set in order, then ``content-type`` and ``content-length``
    follow (as Litestar adds them)."""

    status: int
    media_type: str
    body: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def to_response(reply: Reply) -> Response[bytes]:
    """The reply for Litestar's router."""
    return Response(
        content=reply.body,
        status_code=reply.status,
        media_type=reply.media_type,
        headers=reply.headers or None,
    )


async def send_reply(reply: Reply, send: Callable[[Any], Awaitable[None]]) -> None:
    """The reply as the ASGI messages Litestar's response sends for it."""
    media_type = reply.media_type
    if media_type.startswith("text/"):
        media_type += "; charset=utf-8"
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
    headers.append((b"content-type", media_type.encode("latin-1")))
    headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})
