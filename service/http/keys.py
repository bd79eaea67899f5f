"""The Idempotency-Key header.

An RFC 8941 sf-string (``"…"``, with ``\\"`` and ``\\\\`` escapes) or the bare value; after
unquoting, 1-255 printable ASCII characters (0x20-0x7E).
"""

from __future__ import annotations

import re

from service.http.problems import ProblemError

__all__ = ["MAX_KEY_LENGTH", "IdempotencyKeyError", "parse_idempotency_key"]

MAX_KEY_LENGTH = 255
# every character of a key: printable ASCII, space to tilde
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")


class IdempotencyKeyError(ProblemError):
    """The Idempotency-Key header is missing or unusable."""


def parse_idempotency_key(values: list[str]) -> str:
    if not values:
        raise IdempotencyKeyError(
            "idempotency-key-missing", "the Idempotency-Key header is required"
        )
    if len(values) > 1:
        raise IdempotencyKeyError(
            "idempotency-key-invalid", "send exactly one Idempotency-Key header"
        )
    raw = values[0].strip(" \t")
    key = _unquote(raw) if raw.startswith('"') else raw
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise IdempotencyKeyError(
            "idempotency-key-invalid",
            f"the key must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}",
        )
    if not _PRINTABLE_ASCII.fullmatch(key):
        raise IdempotencyKeyError("idempotency-key-invalid", "the key must be printable ASCII")
    return key


def _unquote(raw: str) -> str:
    if len(raw) < 2 or not raw.endswith('"'):
        raise IdempotencyKeyError("idempotency-key-invalid", "unterminated quoted key")
    out = []
    body = raw[1:-1]
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body) or body[i + 1] not in '"\\':
                raise IdempotencyKeyError("idempotency-key-invalid", "bad escape in quoted key")
            out.append(body[i + 1])
            i += 2
            continue
        if c == '"':
            raise IdempotencyKeyError("idempotency-key-invalid", "unescaped quote in quoted key")
        out.append(c)
        i += 1
    return "".join(out)
