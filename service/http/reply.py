"""A response before it is Litestar's: status, media type, encoded body and headers.

The use cases' answers and the problem documents are built as a :class:`Reply`; a handler
returns it as a Litestar ``Response`` (:func:`to_response`) or, on the idempotent routes,
as the ``ASGIResponse`` it would become (:func:`to_asgi`), since the body is already encoded.
"""

from __future__ import annotations

import msgspec
from litestar import Response
from litestar.response.base import ASGIResponse

__all__ = ["Reply", "to_asgi", "to_response"]


class Reply(msgspec.Struct):
    """A response: its headers are set in order, then ``content-type`` and ``content-length``
    follow (as Litestar adds them)."""

    status: int
    media_type: str
    body: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)


def to_response(reply: Reply) -> Response[bytes]:
    """The reply as a Litestar ``Response``."""
    return Response(
        content=reply.body,
        status_code=reply.status,
        media_type=reply.media_type,
        headers=reply.headers or None,
    )


def to_asgi(reply: Reply) -> ASGIResponse:
    """The reply as the ASGI response Litestar would make of :func:`to_response`."""
    return ASGIResponse(
        body=reply.body,
        status_code=reply.status,
        media_type=reply.media_type,
        headers=reply.headers,
    )
