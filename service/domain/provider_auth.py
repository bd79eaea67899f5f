"""Signed calls to the provider: the settlement server proves each ``POST /payments`` is its own.

The MAC is HMAC-SHA256, in lower-case hex, under the **request key**: HMAC-SHA256 of the
label ``settlement/provider-request/v1`` under the provider secret (``provider_secret``, the
one that signs evidence). One secret is configured, but the two uses have separate keys, so
a MAC made for a request can never stand for an evidence signature or the other way round,
whatever bytes either covers.

What is signed, each field on its own line (none can hold a newline: the method is a token,
the path is the route's, the sink key printable ASCII, the timestamp digits)::

    POST
    /payments
    <sink key: the Idempotency-Key header>
    <timestamp: the Settlement-Timestamp header, Unix seconds>
    <SHA-256 in hex of the exact body bytes>

The MAC travels in ``Settlement-Signature``. The provider refuses (401, nothing committed) a
missing or wrong MAC, and a timestamp more than :data:`MAX_CLOCK_SKEW` away from its clock.
Every function here is pure: the clock is a parameter.
"""

from __future__ import annotations

import hashlib
import hmac
import re

__all__ = [
    "MAX_CLOCK_SKEW",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "check_request",
    "request_key",
    "request_signature",
    "signed_headers",
]

SIGNATURE_HEADER = "Settlement-Signature"
TIMESTAMP_HEADER = "Settlement-Timestamp"

# Seconds a signed call stays acceptable: covers a badly synchronised clock and a call that
# waited for a pooled connection, then a captured call can no longer be replayed.
MAX_CLOCK_SKEW = 300

# The domain-separation label of the request key (see the module docstring).
_REQUEST_KEY_LABEL = b"settlement/provider-request/v1"
# Unix seconds: digits only, and few enough that int() stays cheap on hostile input.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


def request_key(secret: str) -> bytes:
    """The key request MACs are made with, derived from the shared provider secret."""
    return hmac.new(secret.encode(), _REQUEST_KEY_LABEL, hashlib.sha256).digest()


def request_signature(
    key: bytes, *, method: str, path: str, sink_key: str, timestamp: str, body: bytes
) -> str:
    """The MAC of one call (what is covered is in the module docstring)."""
    message = "\n".join(
        (method.upper(), path, sink_key, timestamp, hashlib.sha256(body).hexdigest())
    )
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    key: bytes, *, method: str, path: str, sink_key: str, body: bytes, now: float
) -> dict[str, str]:
    """The two headers that authenticate a call made at ``now`` (Unix seconds)."""
    timestamp = str(int(now))
    signature = request_signature(
        key, method=method, path=path, sink_key=sink_key, timestamp=timestamp, body=body
    )
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature}


def check_request(
    key: bytes,
    *,
    method: str,
    path: str,
    sink_key: str,
    timestamps: list[str],
    signatures: list[str],
    body: bytes,
    now: float,
) -> str | None:
    """None when the call is authentic and fresh; otherwise why it is refused.

    ``timestamps`` and ``signatures`` are every value of the two headers: exactly one each.
    The MAC is compared in constant time, as bytes.
    """
    if len(timestamps) != 1 or len(signatures) != 1:
        return f"send exactly one {TIMESTAMP_HEADER} and one {SIGNATURE_HEADER} header"
    timestamp = timestamps[0].strip(" \t")
    if _TIMESTAMP.fullmatch(timestamp) is None:
        return f"{TIMESTAMP_HEADER} must be Unix seconds"
    if abs(now - int(timestamp)) > MAX_CLOCK_SKEW:
        return f"{TIMESTAMP_HEADER} is more than {MAX_CLOCK_SKEW} s away from the provider's clock"
    expected = request_signature(
        key, method=method, path=path, sink_key=sink_key, timestamp=timestamp, body=body
    )
    # latin-1 gives back the header's bytes as they came (headers are decoded as latin-1)
    given = signatures[0].strip(" \t").encode("latin-1", errors="replace")
    if not hmac.compare_digest(expected.encode(), given):
        return f"{SIGNATURE_HEADER} does not verify"
    return None
