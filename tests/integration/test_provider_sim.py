"""The provider simulator as a real process over HTTP: one payment per sink key, signed
evidence, faults that behave like a real provider's failures, and a store that survives; it
pays only calls the settlement server signed, only for the fingerprint of what it pays, and
its controls are locked by a token (and need one off loopback)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from devstack.provider.faults import MAX_FAULT_COUNT
from service.domain.provider_auth import MAX_CLOCK_SKEW
from service.evidence import SignedEvidence, verify
from tests.e2e.provider import (
    CALL_TIMEOUT,
    SECRET,
    ProviderProcess,
    make_payment,
    signed,
)
from tests.e2e.server import START_TIMEOUT, free_port

# Concurrent identical calls in the one-winner test.
CONCURRENT_CALLS = 20
# Delayed-commit test: the simulator sleeps this long, the client gives up much earlier.
DELAY_MS = 1500
CLIENT_TIMEOUT = 0.3
COMMIT_DEADLINE = 3.0


# The control token of the locked simulator.
SIM_TOKEN = "sim-control-token"


def signed_evidence(response: httpx.Response) -> SignedEvidence:
    """What the settlement server does with an answer: pick evidence and signature, decode."""
    data = response.json()
    picked = {"evidence": data["evidence"], "signature": data["signature"]}
    return msgspec.json.decode(msgspec.json.encode(picked), type=SignedEvidence)


@pytest.fixture(scope="module")
def provider() -> Iterator[ProviderProcess]:
    with (
        tempfile.TemporaryDirectory(prefix="provider-sim-") as tmp,
        ProviderProcess(Path(tmp) / "provider.sqlite3") as proc,
    ):
        yield proc


@pytest.fixture(autouse=True)
def _no_faults_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "provider" in request.fixturenames:
        request.getfixturevalue("provider").clear_faults()


def test_same_sink_key_replays_the_same_signed_answer(provider: ProviderProcess) -> None:
    body, key = make_payment()

    first = provider.pay(body, key)
    second = provider.pay(body, key)

    assert first.status_code == second.status_code == 201
    assert first.content == second.content  # same reference, evidence and signature
    assert first.headers["Idempotent-Replayed"] == "false"
    assert second.headers["Idempotent-Replayed"] == "true"
    assert provider.counts(key) == {"count": 1, "declines": 0}

    signed = signed_evidence(first)
    reference = first.json()["reference"]
    assert reference.startswith("pay_") and len(reference) == 4 + 24
    assert verify(signed, SECRET)
    ev = signed.evidence
    assert (str(ev.operation_id), ev.binding_generation) == (body["operation_id"], 1)
    assert ev.request_fingerprint == body["request_fingerprint"]
    assert ev.outcome == "completed"
    assert ev.result.status == 201
    assert ev.result.body == {
        "id": body["operation_id"],
        "provider_reference": reference,
        "amount": body["amount"],
        "currency": body["currency"],
        "beneficiary": body["beneficiary"],
    }


def test_tampered_evidence_does_not_verify(provider: ProviderProcess) -> None:
    body, key = make_payment()
    signed = signed_evidence(provider.pay(body, key))
    ev = signed.evidence
    more = msgspec.structs.replace(
        ev.result, body={**ev.result.body, "amount": ev.result.body["amount"] + 1}
    )

    assert verify(signed, SECRET)
    more_amount = msgspec.structs.replace(ev, result=more)
    assert not verify(msgspec.structs.replace(signed, evidence=more_amount), SECRET)
    other_digest = msgspec.structs.replace(ev, result_digest="0" * 64)
    assert not verify(msgspec.structs.replace(signed, evidence=other_digest), SECRET)
    assert not verify(signed, "another secret")


def test_different_sink_keys_make_different_payments(provider: ProviderProcess) -> None:
    first_body, first_key = make_payment()
    second_body, second_key = make_payment()

    first = provider.pay(first_body, first_key)
    second = provider.pay(second_body, second_key)

    assert first.status_code == second.status_code == 201
    assert first.json()["reference"] != second.json()["reference"]
    assert provider.counts(first_key) == provider.counts(second_key) == {"count": 1, "declines": 0}


def test_sink_key_reused_with_a_different_amount_is_refused(provider: ProviderProcess) -> None:
    body, key = make_payment()
    original = provider.pay(body, key)
    more, _ = make_payment(operation_id=body["operation_id"], amount=body["amount"] + 1)

    reused = provider.pay(more, key)

    assert reused.status_code == 422
    assert reused.json() == {"error": "sink key reused with a different request"}
    assert provider.counts(key) == {"count": 1, "declines": 0}
    assert provider.pay(body, key).content == original.content


def test_concurrent_identical_calls_make_one_payment(provider: ProviderProcess) -> None:
    body, key = make_payment()
    content = msgspec.json.encode(body)
    start = threading.Barrier(CONCURRENT_CALLS)

    with httpx.Client(base_url=provider.base_url, timeout=CALL_TIMEOUT) as client:

        def call(_: int) -> httpx.Response:
            start.wait()
            return client.post("/payments", content=content, headers=signed(content, key))

        with ThreadPoolExecutor(CONCURRENT_CALLS) as pool:
            responses = list(pool.map(call, range(CONCURRENT_CALLS)))

    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["reference"] for r in responses}) == 1
    assert len({r.content for r in responses}) == 1
    assert [r.headers["Idempotent-Replayed"] for r in responses].count("false") == 1
    assert provider.counts(key) == {"count": 1, "declines": 0}


def test_error_5xx_commits_nothing_and_the_next_call_pays(provider: ProviderProcess) -> None:
    body, key = make_payment()
    provider.arm("error_5xx")

    failed = provider.pay(body, key)
    assert failed.status_code == 503
    assert provider.counts(key) == {"count": 0, "declines": 0}

    retried = provider.pay(body, key)
    assert retried.status_code == 201
    assert provider.counts(key) == {"count": 1, "declines": 0}


def test_a_replay_neither_takes_nor_feels_an_armed_fault(provider: ProviderProcess) -> None:
    paid_body, paid_key = make_payment()
    paid = provider.pay(paid_body, paid_key)
    provider.arm("error_5xx")

    replay = provider.pay(paid_body, paid_key)
    new_body, new_key = make_payment()
    new = provider.pay(new_body, new_key)

    assert replay.status_code == 201 and replay.content == paid.content
    assert new.status_code == 503


def test_decline_is_recorded_and_replayed(provider: ProviderProcess) -> None:
    body, key = make_payment()
    provider.arm("decline")

    declined = provider.pay(body, key)
    again = provider.pay(body, key)

    assert declined.status_code == again.status_code == 402
    assert declined.content == again.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert provider.counts(key) == {"count": 0, "declines": 1}
    signed = signed_evidence(declined)
    assert verify(signed, SECRET)
    assert signed.evidence.outcome == "failed"
    assert signed.evidence.result.status == 402
    assert signed.evidence.result.body == {
        "type": "/problems/payout-declined",
        "title": "Payout declined",
        "status": 402,
        "detail": "the provider declined the payout",
        "operation_id": body["operation_id"],
        "state": "failed",
    }


def test_delayed_payment_commits_after_the_caller_gave_up(provider: ProviderProcess) -> None:
    body, key = make_payment()
    provider.arm("delay", delay_ms=DELAY_MS)

    with pytest.raises(httpx.TimeoutException):
        provider.pay(body, key, timeout=CLIENT_TIMEOUT)
    assert provider.counts(key)["count"] == 0  # still sleeping: nothing committed yet

    deadline = time.monotonic() + COMMIT_DEADLINE
    while provider.counts(key)["count"] == 0:
        assert time.monotonic() < deadline, "the delayed payment was never committed"
        time.sleep(0.05)
    retried = provider.pay(body, key)
    assert retried.status_code == 201
    assert retried.headers["Idempotent-Replayed"] == "true"
    assert verify(signed_evidence(retried), SECRET)
    assert provider.counts(key) == {"count": 1, "declines": 0}


def test_dropped_response_still_commits_the_payment(provider: ProviderProcess) -> None:
    body, key = make_payment()
    provider.arm("drop_response")

    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        provider.pay(body, key)
    assert provider.counts(key) == {"count": 1, "declines": 0}

    retried = provider.pay(body, key)
    assert retried.status_code == 201
    assert retried.headers["Idempotent-Replayed"] == "true"
    assert verify(signed_evidence(retried), SECRET)
    assert provider.counts(key) == {"count": 1, "declines": 0}


def test_payments_survive_a_restart(tmp_path: Path) -> None:
    db_path = tmp_path / "provider.sqlite3"
    body, key = make_payment()
    with ProviderProcess(db_path) as first:
        before = first.pay(body, key)
        assert before.status_code == 201
        # uvicorn shuts down, then re-raises the SIGTERM it caught: death by SIGTERM is normal
        assert first.stop() in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in first.output()

    with ProviderProcess(db_path) as second:
        after = second.pay(body, key)
        assert after.status_code == 201
        assert after.content == before.content
        assert second.counts(key) == {"count": 1, "declines": 0}


def test_shutdown_waits_for_a_delayed_commit(tmp_path: Path) -> None:
    db_path = tmp_path / "provider.sqlite3"
    body, key = make_payment()
    with ProviderProcess(db_path) as first:
        first.arm("delay", delay_ms=DELAY_MS)
        with pytest.raises(httpx.TimeoutException):
            first.pay(body, key, timeout=CLIENT_TIMEOUT)
        assert first.counts(key)["count"] == 0
        first.stop()

    with ProviderProcess(db_path) as second:
        assert second.counts(key) == {"count": 1, "declines": 0}
        assert second.pay(body, key).status_code == 201


@pytest.mark.parametrize(
    "overrides",
    [
        {"operation_id": "not-a-uuid"},
        {"binding_generation": 0},
        {"binding_generation": "1"},
        {"request_fingerprint": "ab" * 31},
        {"request_fingerprint": "zz" * 32},
        {"beneficiary": ""},
        {"beneficiary": "x" * 129},
        {"amount": 0},
        {"amount": -5},
        {"amount": 12.5},
        {"amount": "1250"},
        {"currency": "eur"},
        {"currency": "EURO"},
        {"unexpected": True},
        # a payment the provider's schema takes but no server reservation can stand for
        {"currency": "XXQ"},
        {"beneficiary": "Zoë"},
        {"amount": 10**15 + 1},
    ],
    ids=lambda o: "-".join(f"{k}={v!r}"[:30] for k, v in o.items()),
)
def test_invalid_body_is_refused_and_commits_nothing(
    provider: ProviderProcess, overrides: dict[str, Any]
) -> None:
    body, key = make_payment(**overrides)

    response = provider.pay(body, key)

    assert response.status_code == 400, response.text
    assert response.json()["error"]
    assert provider.counts(key) == {"count": 0, "declines": 0}


@pytest.mark.parametrize(
    "content",
    [b"", b"not json", b"[]", b'{"amount": 1}'],
    ids=["empty", "not-json", "array", "missing-fields"],
)
def test_undecodable_body_is_refused_and_commits_nothing(
    provider: ProviderProcess, content: bytes
) -> None:
    key = f"{uuid.uuid4()}:1"

    response = provider.post_payment(content, signed(content, key))

    assert response.status_code == 400
    assert response.json()["error"]
    assert provider.counts(key) == {"count": 0, "declines": 0}


def test_missing_sink_key_is_refused_and_commits_nothing(provider: ProviderProcess) -> None:
    body, _ = make_payment()
    before = provider.counts()

    response = provider.pay(body, None)

    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["error"]
    assert provider.counts() == before


def test_fault_control_validates_its_input(provider: ProviderProcess) -> None:
    url = f"{provider.base_url}/_sim/faults"
    for bad in (
        {"mode": "explode", "count": 1},
        {"mode": "decline", "count": 0},
        {"mode": "delay", "count": 1},
        {"mode": "decline", "count": 1, "delay_ms": 10},
        {"mode": "delay", "count": 1, "delay_ms": -1},
        {"mode": "decline", "count": MAX_FAULT_COUNT + 1},
        {"mode": "error_5xx", "count": 10**30},
    ):
        assert httpx.post(url, json=bad, timeout=CALL_TIMEOUT).status_code == 400, bad
    assert httpx.get(url, timeout=CALL_TIMEOUT).json() == {"armed": []}

    most = {"mode": "decline", "count": MAX_FAULT_COUNT}
    assert httpx.post(url, json=most, timeout=CALL_TIMEOUT).json() == {"armed": [most]}
    httpx.delete(url, timeout=CALL_TIMEOUT)

    armed = httpx.post(url, json={"mode": "delay", "count": 2, "delay_ms": 5}, timeout=CALL_TIMEOUT)
    assert armed.json() == {"armed": [{"mode": "delay", "count": 2, "delay_ms": 5}]}


def test_sink_key_of_another_reservation_is_refused(provider: ProviderProcess) -> None:
    body, key = make_payment()
    other = f"{uuid.uuid4()}:1"
    response = provider.pay(body, other)
    assert response.status_code == 422
    assert provider.counts(other) == provider.counts(key) == {"count": 0, "declines": 0}


# -- who may pay: a signed call, for the fingerprint of what it pays ----------------------------


def test_mallory_under_a_victims_tuple_is_refused_and_commits_nothing(
    provider: ProviderProcess,
) -> None:
    """The attack: the victim's reservation tuple and fingerprint, another beneficiary. Not
    signed by the server it is 401; signed (a caller holding the secret, or a buggy one) it
    is 422, since the fingerprint is not MALLORY's payout's. Nothing is paid, no evidence is
    made, and the victim's own payout then pays the victim's beneficiary once."""
    victim, key = make_payment(beneficiary="ACME Ltd")
    mallory = {**victim, "beneficiary": "MALLORY"}
    content = msgspec.json.encode(mallory)

    unsigned = provider.post_payment(
        content, {"Idempotency-Key": key, "Content-Type": "application/json"}
    )
    forged = provider.post_payment(content, signed(content, key, secret="guessed"))
    insider = provider.post_payment(content, signed(content, key))

    assert unsigned.status_code == forged.status_code == 401
    assert insider.status_code == 422
    assert insider.json() == {"error": "request_fingerprint is not the fingerprint of this payout"}
    for refused in (unsigned, forged, insider):
        assert "evidence" not in refused.json()
    assert provider.counts(key) == {"count": 0, "declines": 0}

    paid = provider.pay(victim, key)
    assert paid.status_code == 201
    assert signed_evidence(paid).evidence.result.body["beneficiary"] == "ACME Ltd"
    assert provider.pay(victim, key).content == paid.content
    assert provider.counts(key) == {"count": 1, "declines": 0}


def _resigned(content: bytes, key: str, **changes: str) -> dict[str, str]:
    return {**signed(content, key), **changes}


@pytest.mark.parametrize(
    "headers_of",
    [
        lambda c, k: {"Idempotency-Key": k, "Content-Type": "application/json"},
        lambda c, k: {k_: v for k_, v in signed(c, k).items() if k_ != "Settlement-Timestamp"},
        lambda c, k: {k_: v for k_, v in signed(c, k).items() if k_ != "Settlement-Signature"},
        lambda c, k: signed(c, k, secret="another secret"),
        lambda c, k: _resigned(c, k, **{"Settlement-Signature": "0" * 64}),
        lambda c, k: _resigned(
            c, k, **{"Settlement-Signature": signed(c, k)["Settlement-Signature"].upper()}
        ),
        lambda c, k: {**signed(c.replace(b"1250", b"1251"), k), "Idempotency-Key": k},
        lambda c, k: {**signed(c, f"{uuid.uuid4()}:1"), "Idempotency-Key": k},
        lambda c, k: _resigned(c, k, **{"Settlement-Timestamp": str(int(time.time()) + 1)}),
        lambda c, k: signed(c, k, now=time.time() - MAX_CLOCK_SKEW - 30),
        lambda c, k: signed(c, k, now=time.time() + MAX_CLOCK_SKEW + 30),
        lambda c, k: _resigned(c, k, **{"Settlement-Timestamp": "soon"}),
    ],
    ids=[
        "unsigned",
        "no-timestamp",
        "no-signature",
        "wrong-secret",
        "zero-signature",
        "upper-case-signature",
        "signature-of-another-body",
        "signature-for-another-sink-key",
        "timestamp-changed-after-signing",
        "stale",
        "from-the-future",
        "timestamp-not-a-number",
    ],
)
def test_a_payment_not_signed_by_the_server_is_401_and_commits_nothing(
    provider: ProviderProcess, headers_of: Any
) -> None:
    body, key = make_payment()
    content = msgspec.json.encode(body)

    refused = provider.post_payment(content, headers_of(content, key))

    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]
    assert provider.counts(key) == {"count": 0, "declines": 0}
    assert provider.post_payment(content, signed(content, key)).status_code == 201


def test_a_timestamp_within_the_window_is_accepted(provider: ProviderProcess) -> None:
    for skew in (-MAX_CLOCK_SKEW + 30, MAX_CLOCK_SKEW - 30):
        body, key = make_payment()
        content = msgspec.json.encode(body)
        paid = provider.post_payment(content, signed(content, key, now=time.time() + skew))
        assert paid.status_code == 201, paid.text


def test_a_signed_payment_for_another_fingerprint_is_422_and_commits_nothing(
    provider: ProviderProcess,
) -> None:
    body, key = make_payment(request_fingerprint="ab" * 32)

    refused = provider.pay(body, key)

    assert refused.status_code == 422
    assert provider.counts(key) == {"count": 0, "declines": 0}


# -- the controls: a bearer token, and none needed only on loopback ----------------------------


@pytest.fixture(scope="module")
def locked() -> Iterator[ProviderProcess]:
    with ProviderProcess(sim_token=SIM_TOKEN) as proc:
        yield proc


CONTROLS = [
    ("POST", "/_sim/faults", {"mode": "decline", "count": 1}),
    ("GET", "/_sim/faults", None),
    ("DELETE", "/_sim/faults", None),
    ("GET", "/_sim/payments", None),
    ("POST", "/_sim/feed-faults", {"mode": "overlap", "count": 1}),
    ("GET", "/_sim/feed-faults", None),
    ("DELETE", "/_sim/feed-faults", None),
]


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", f"Bearer {SIM_TOKEN}x", f"Basic {SIM_TOKEN}", SIM_TOKEN, "Bearer"],
    ids=["missing", "wrong", "longer", "basic", "no-scheme", "no-token"],
)
def test_controls_with_a_token_set_refuse_a_call_without_it(
    locked: ProviderProcess, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path, body in CONTROLS:
        refused = httpx.request(
            method, f"{locked.base_url}{path}", json=body, headers=headers, timeout=CALL_TIMEOUT
        )
        assert refused.status_code == 401, (method, path, refused.text)
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert "armed" not in refused.json() and "count" not in refused.json()
    good = httpx.get(
        f"{locked.base_url}/_sim/faults", headers=locked.control_headers(), timeout=CALL_TIMEOUT
    )
    assert good.json() == {"armed": []}  # the refused POST armed nothing
    assert locked.feed_faults() == []


def test_controls_with_a_token_set_take_the_token(locked: ProviderProcess) -> None:
    body, key = make_payment()
    locked.arm("decline")  # sends Authorization: Bearer <token>, asserts 200

    declined = locked.pay(body, key)  # payments are authenticated by their MAC, not the token

    assert declined.status_code == 402
    assert locked.counts(key) == {"count": 0, "declines": 1}
    lower = httpx.get(
        f"{locked.base_url}/_sim/payments",
        params={"key": key},
        headers={"Authorization": f"bearer {SIM_TOKEN}"},
        timeout=CALL_TIMEOUT,
    )
    assert lower.json() == {"count": 0, "declines": 1}
    assert httpx.get(f"{locked.base_url}/health", timeout=CALL_TIMEOUT).status_code == 200


def _start_simulator(host: str, *args: str, token: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "SETTLEMENT_SIM_TOKEN"}
    env["SETTLEMENT_PROVIDER_SECRET"] = SECRET
    if token is not None:
        env["SETTLEMENT_SIM_TOKEN"] = token
    return subprocess.Popen(
        [sys.executable, *args, "--host", host, "--port", str(free_port())],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "provider.example"])
@pytest.mark.parametrize(
    "command",
    [("-m", "devstack.provider", "--db"), ("-m", "service.cli", "provider-sim", "--db")],
    ids=["module", "cli"],
)
def test_simulator_refuses_to_start_off_loopback_without_a_token(
    tmp_path: Path, host: str, command: tuple[str, ...]
) -> None:
    db = tmp_path / "provider.sqlite3"
    proc = _start_simulator(host, *command, str(db))
    try:
        output, _ = proc.communicate(timeout=START_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 2, output
    assert "SETTLEMENT_SIM_TOKEN" in output and "loopback" in output, output
    assert not db.exists()  # refused before opening anything
