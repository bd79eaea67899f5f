"""A provider's event feeds (docs/design.md §8): the configuration and the HTTP client.

Two kinds of feed serve the same events, each with signed evidence of one payment:

* ``cursor``: ``GET <url>?cursor=<opaque>&limit=<n>`` answers
  ``{"events": [{event_id, position, evidence, signature}], "next_cursor": "..."}``;
* ``timestamp``: ``GET <url>?after=<unix seconds>&limit=<n>`` answers
  ``{"events": [{event_id, timestamp, evidence, signature}], "finality_watermark": <int|null>}``.

``SETTLEMENT_FEEDS`` names them: ``name=kind:url,...``. Every call is bounded in time and
size; an answer that is not exactly this shape is a :class:`FeedUnavailable`, like a timeout.
Evidence is decoded (not trusted): its signature is the observer's to check.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, TypeVar

import httpx
import msgspec

from service.config import FeedSpec, parse_feeds
from service.evidence import SignedEvidence

__all__ = [
    "CursorPage",
    "FeedClient",
    "FeedSpec",
    "FeedUnavailable",
    "TimestampPage",
    "decode_signed",
    "parse_feeds",
]

T = TypeVar("T")

# Largest page read into memory: 500 events of about a kilobyte each, with room to spare.
MAX_PAGE_BYTES = 4 * 1024 * 1024

EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
Order = Annotated[int, msgspec.Meta(ge=0, le=2**62)]


class RawEvent(msgspec.Struct, frozen=True):
    """An event as served, before its evidence is decoded (a malformed one is held, not a
    reason to refuse the whole page)."""

    event_id: EventId
    evidence: msgspec.Raw
    signature: Annotated[str, msgspec.Meta(max_length=256)]
    position: Order | None = None
    timestamp: Order | None = None


class CursorPage(msgspec.Struct, frozen=True):
    events: list[RawEvent]
    next_cursor: Annotated[str, msgspec.Meta(max_length=4096)]


class TimestampPage(msgspec.Struct, frozen=True):
    events: list[RawEvent]
    finality_watermark: Order | None = None


class FeedUnavailable(Exception):
    """No usable page: timeout, transport error, an error status, or an answer of the wrong
    shape."""


def decode_signed(event: RawEvent) -> SignedEvidence | None:
    """The event's signed evidence, validated as such (not yet verified), or None when it is
    not evidence at all."""
    try:
        signature = msgspec.json.encode(event.signature)
        return msgspec.json.decode(
            b'{"evidence":' + bytes(event.evidence) + b',"signature":' + signature + b"}",
            type=SignedEvidence,
        )
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None


class FeedClient:
    def __init__(self, spec: FeedSpec, *, timeout: float) -> None:
        """``timeout``: the longest one page request may take, end to end."""
        self.spec = spec
        self._timeout = timeout
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout))

    async def close(self) -> None:
        await self._client.aclose()

    async def cursor_page(self, cursor: str, limit: int) -> CursorPage:
        page = await self._get({"cursor": cursor, "limit": limit}, CursorPage)
        if any(event.position is None for event in page.events):
            raise FeedUnavailable(f"feed {self.spec.name}: an event without a position")
        return page

    async def timestamp_page(self, after: int | None, limit: int) -> TimestampPage:
        params: dict[str, Any] = {"limit": limit}
        if after is not None:
            params["after"] = after
        page = await self._get(params, TimestampPage)
        if any(event.timestamp is None for event in page.events):
            raise FeedUnavailable(f"feed {self.spec.name}: an event without a timestamp")
        return page

    async def _get(self, params: dict[str, Any], shape: type[T]) -> T:
        try:
            async with asyncio.timeout(self._timeout):  # the whole request, not each read
                body = await self._read(params)
        except TimeoutError:
            raise FeedUnavailable(f"feed {self.spec.name}: no whole page in time") from None
        try:
            return msgspec.json.decode(bytes(body), type=shape)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            raise FeedUnavailable(f"feed {self.spec.name}: not a feed page ({exc})") from None

    async def _read(self, params: dict[str, Any]) -> bytearray:
        try:
            async with self._client.stream("GET", self.spec.url, params=params) as answer:
                if answer.status_code != 200:
                    raise FeedUnavailable(f"feed {self.spec.name}: HTTP {answer.status_code}")
                body = bytearray()
                async for chunk in answer.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_PAGE_BYTES:
                        raise FeedUnavailable(f"feed {self.spec.name}: page too large")
        except httpx.HTTPError as exc:
            raise FeedUnavailable(f"feed {self.spec.name}: {type(exc).__name__}") from None
        return body
