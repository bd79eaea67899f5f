"""The request fingerprint and the digest of a stored outcome.

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

__all__ = ["fingerprint", "result_digest"]


def fingerprint(route: str, path_params: dict[str, Any], body: msgspec.Struct) -> str:
    canonical = msgspec.json.encode(
        {"route": route, "path": path_params, "body": msgspec.to_builtins(body)},
        order="sorted",
    )
    return hashlib.sha256(canonical).hexdigest()
