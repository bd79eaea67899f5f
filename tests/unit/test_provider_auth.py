"""Signed provider calls and the simulator's bind rule, as pure functions: a call verifies
only with every covered part unchanged, only within the clock window, only under the key
derived from the shared secret; the controls stay open only on loopback."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from devstack.provider.run import UnsafeBind, check_bind
from service.domain.provider_auth import (
    MAX_CLOCK_SKEW,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    check_request,
    request_key,
    request_signature,
    signed_headers,
)

SECRET = "unit-secret"
NOW = 1_700_000_000.0
CALL = {"method": "POST", "path": "/payments", "sink_key": "op:1", "body": b'{"amount":1}'}


def verdict(headers: dict[str, str], now: float = NOW, **changes: object) -> str | None:
    call = {**CALL, **changes}
    return check_request(
        request_key(SECRET),
        method=str(call["method"]),
        path=str(call["path"]),
        sink_key=str(call["sink_key"]),
        timestamps=[headers[TIMESTAMP_HEADER]] if TIMESTAMP_HEADER in headers else [],
        signatures=[headers[SIGNATURE_HEADER]] if SIGNATURE_HEADER in headers else [],
        body=call["body"],  # type: ignore[arg-type]
        now=now,
    )


def sign_at(now: float, secret: str = SECRET) -> dict[str, str]:
    return signed_headers(request_key(secret), now=now, **CALL)  # type: ignore[arg-type]


def test_a_call_signed_now_verifies() -> None:
    headers = sign_at(NOW)
    assert headers[TIMESTAMP_HEADER] == str(int(NOW))
    assert len(headers[SIGNATURE_HEADER]) == 64
    assert verdict(headers) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"method": "PUT"},
        {"path": "/payments/x"},
        {"sink_key": "op:2"},
        {"body": b'{"amount":2}'},
        {"body": b'{"amount":1} '},
    ],
    ids=["method", "path", "sink-key", "body", "body-whitespace"],
)
def test_any_covered_part_changed_fails(changes: dict[str, object]) -> None:
    assert verdict(sign_at(NOW), **changes) == f"{SIGNATURE_HEADER} does not verify"


def test_another_secret_fails() -> None:
    assert verdict(sign_at(NOW, secret="other")) is not None


@pytest.mark.parametrize("skew", [-MAX_CLOCK_SKEW, 0, MAX_CLOCK_SKEW])
def test_a_timestamp_within_the_window_verifies(skew: int) -> None:
    assert verdict(sign_at(NOW + skew)) is None


@pytest.mark.parametrize("skew", [-MAX_CLOCK_SKEW - 1, MAX_CLOCK_SKEW + 1])
def test_a_timestamp_beyond_the_window_fails(skew: int) -> None:
    refused = verdict(sign_at(NOW + skew))
    assert refused is not None and "away from the provider's clock" in refused


@pytest.mark.parametrize("timestamp", ["", "soon", "-5", "1.5", "1" * 13, "١٢٣"])
def test_a_timestamp_that_is_not_unix_seconds_fails(timestamp: str) -> None:
    headers = {**sign_at(NOW), TIMESTAMP_HEADER: timestamp}
    assert verdict(headers) == f"{TIMESTAMP_HEADER} must be Unix seconds"


def test_a_missing_or_repeated_header_fails() -> None:
    headers = sign_at(NOW)
    for missing in (TIMESTAMP_HEADER, SIGNATURE_HEADER):
        assert verdict({k: v for k, v in headers.items() if k != missing}) is not None
    key = request_key(SECRET)
    twice = check_request(
        key,
        method="POST",
        path="/payments",
        sink_key="op:1",
        timestamps=[headers[TIMESTAMP_HEADER]] * 2,
        signatures=[headers[SIGNATURE_HEADER]],
        body=CALL["body"],  # type: ignore[arg-type]
        now=NOW,
    )
    assert twice is not None


def test_the_request_key_is_not_the_evidence_key() -> None:
    """Evidence is signed under the secret itself; calls under a key derived with a label."""
    key = request_key(SECRET)
    assert key != SECRET.encode()
    assert key == hmac.new(SECRET.encode(), b"settlement/provider-request/v1", "sha256").digest()
    message = "\n".join(
        ["POST", "/payments", "op:1", "7", hashlib.sha256(CALL["body"]).hexdigest()]  # type: ignore[arg-type]
    ).encode()
    signature = request_signature(
        key,
        method="POST",
        path="/payments",
        sink_key="op:1",
        timestamp="7",
        body=CALL["body"],  # type: ignore[arg-type]
    )
    assert signature == hmac.new(key, message, "sha256").hexdigest()
    assert signature != hmac.new(SECRET.encode(), message, "sha256").hexdigest()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost"])
def test_loopback_binds_need_no_token(host: str) -> None:
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "provider.example", "[::1]"])
def test_other_binds_need_a_token(host: str) -> None:
    with pytest.raises(UnsafeBind, match="SETTLEMENT_SIM_TOKEN"):
        check_bind(host, None)
    check_bind(host, "a-token")
