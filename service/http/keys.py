"""Idempotency-Key parsing and the request fingerprint.

Key: an RFC 8941 sf-string (``"…"``, with ``\\"`` and ``\\\\`` escapes) or the bare value;
after unquoting, 1-255 printable ASCII characters (0x20-0x7E).

Fingerprint rule: SHA-256 (hex) of the JSON encoding, with object keys sorted, of
``{"route": <method and path template>, "path": <path parameters>, "body": <the decoded,
validated request Struct with every default filled in>}``. Key order, whitespace, and
omitting a field versus sending its default do not change it; any semantically different
value does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from service.evidence import result_digest
from service.http.problems import ProblemError

__all__ = ["KeyError_", "fingerprint", "parse_idempotency_key", "result_digest"]

MAX_KEY_LENGTH = 255


class KeyError_(ProblemError):
    """The Idempotency-Key header is missing or unusable."""


def parse_idempotency_key(values: list[str]) -> str:
    if not values:
        raise KeyError_("idempotency-key-missing", "the Idempotency-Key header is required")
    if len(values) > 1:
        raise KeyError_("idempotency-key-invalid", "send exactly one Idempotency-Key header")
    raw = values[0].strip(" \t")
    key = _unquote(raw) if raw.startswith('"') else raw
    if not 1 <= len(key) <= MAX_KEY_LENGTH:
        raise KeyError_(
            "idempotency-key-invalid",
            f"the key must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}",
        )
    if any(not 0x20 <= ord(c) <= 0x7E for c in key):
        raise KeyError_("idempotency-key-invalid", "the key must be printable ASCII")
    return key


def _unquote(raw: str) -> str:
    if len(raw) < 2 or not raw.endswith('"'):
        raise KeyError_("idempotency-key-invalid", "unterminated quoted key")
    out = []
    body = raw[1:-1]
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            if i + 1 >= len(body) or body[i + 1] not in '"\\':
                raise KeyError_("idempotency-key-invalid", "bad escape in quoted key")
            out.append(body[i + 1])
            i += 2
            continue
        if c == '"':
            raise KeyError_("idempotency-key-invalid", "unescaped quote in quoted key")
        out.append(c)
        i += 1
    return "".join(out)


def fingerprint(route: str, path_params: dict[str, Any], body: msgspec.Struct) -> str:
    canonical = msgspec.json.encode(
        {"route": route, "path": path_params, "body": msgspec.to_builtins(body)},
        order="sorted",
    )
    return hashlib.sha256(canonical).hexdigest()
