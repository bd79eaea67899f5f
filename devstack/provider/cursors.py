"""Opaque cursor tokens of the simulator's cursor feed.

A token is the URL-safe base64, without padding, of 14 bytes: the feed position as an
unsigned 8-byte big-endian integer XORed with a fixed 8-byte mask, then a 6-byte tag, the
first 6 bytes of HMAC-SHA256 over ``label + position (8 bytes, big-endian)``. The mask and
the tag key are derived from the provider secret (key: HMAC-SHA256 of
``settlement/provider-feed-cursor/v1`` under it; mask: the first 8 bytes of HMAC-SHA256 of
``mask`` under that key), so a token names its position without showing it: tokens are not
numbers and their order says nothing about the order of positions.

Two variants name each position, with different labels: ``served`` (what a page normally
returns) and ``advance`` (what the ``empty_advance`` fault returns, so that the token is new
while the position is not). Both decode to the same position. Encoding is deterministic: the
same position and variant always give the same 19 characters, whatever the process. The empty
string is the start of the feed (position 0). Anything else that does not decode, or whose
tag is not one of the two, is refused.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re

__all__ = ["CursorCodec", "CursorError", "Variant"]

_KEY_LABEL = b"settlement/provider-feed-cursor/v1"
_POSITION_BYTES = 8
_TAG_BYTES = 6
# 14 bytes in unpadded base64
_TOKEN = re.compile(r"[A-Za-z0-9_-]{19}")
MAX_POSITION = 2**63 - 1  # SQLite's largest integer


class CursorError(ValueError):
    """A cursor that is not one of this simulator's tokens."""


class Variant(enum.Enum):
    SERVED = b"served\n"
    ADVANCE = b"advance\n"

    @property
    def other(self) -> Variant:
        return Variant.ADVANCE if self is Variant.SERVED else Variant.SERVED


class CursorCodec:
    def __init__(self, secret: str) -> None:
        self._key = hmac.new(secret.encode(), _KEY_LABEL, hashlib.sha256).digest()
        self._mask = int.from_bytes(
            hmac.new(self._key, b"mask", hashlib.sha256).digest()[:_POSITION_BYTES], "big"
        )

    def encode(self, position: int, variant: Variant = Variant.SERVED) -> str:
        if not 0 <= position <= MAX_POSITION:
            raise ValueError(f"position {position} is out of range")
        masked = (position ^ self._mask).to_bytes(_POSITION_BYTES, "big")
        raw = masked + self._tag(position, variant)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    def decode(self, token: str) -> tuple[int, Variant]:
        """The position and variant of ``token``; ``""`` is position 0, variant served."""
        if token == "":
            return 0, Variant.SERVED
        if not _TOKEN.fullmatch(token):
            raise CursorError("malformed cursor")
        raw = base64.urlsafe_b64decode(token + "=")
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != token:
            raise CursorError("malformed cursor")  # unused low bits set: not a token we made
        position = int.from_bytes(raw[:_POSITION_BYTES], "big") ^ self._mask
        tag = raw[_POSITION_BYTES:]
        for variant in Variant:
            if position <= MAX_POSITION and hmac.compare_digest(tag, self._tag(position, variant)):
                return position, variant
        raise CursorError("cursor not issued by this feed")

    def _tag(self, position: int, variant: Variant) -> bytes:
        message = variant.value + position.to_bytes(_POSITION_BYTES, "big")
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_TAG_BYTES]
