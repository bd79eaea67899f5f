"""Payouts (external effect) and observers, over HTTP, with a real provider process.

In every test the provider's own count of payments per sink key is asserted: exactly one
where a payout happened, zero where none should have.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
import pytest

from service.domain.payouts import PayoutRequest, payout_fingerprint
from service.evidence import (
    Evidence,
    EvidenceResult,
    canonical,
    content_type_for,
    result_digest,
    sign,
)
from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, new_principal, scalar, until
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.provider import signed as signed_call
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

LEASE_TTL = 1.0
SWEEP_INTERVAL = 0.5
PROVIDER_TIMEOUT = 0.8


def _env(provider: ProviderProcess, **extra: str) -> dict[str, str]:
    return {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
        "SETTLEMENT_PROVIDER_TIMEOUT": str(PROVIDER_TIMEOUT),
        "SETTLEMENT_LATE_RESPONSE_WINDOW": "10",
        "SETTLEMENT_LEASE_TTL": str(LEASE_TTL),
        "SETTLEMENT_SWEEP_INTERVAL": str(SWEEP_INTERVAL),
        **extra,
    }


@pytest.fixture(autouse=True)
def paid(provider: ProviderProcess) -> Iterator[Callable[[], int]]:
    """Payments made during this test, over every sink key; no armed fault leaks out."""
    provider.clear_faults()
    before = provider.total()
    yield lambda: provider.total() - before
    provider.clear_faults()


@pytest.fixture(scope="module")
def payout_server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    with ServerProcess(app_database, services.redis_url, env=_env(provider)) as proc:
        yield proc


@pytest.fixture(scope="module")
def client_key(payout_server: ServerProcess) -> str:
    return str(new_principal(payout_server.base_url)["api_key"])


@pytest.fixture(scope="module")
def observer_key(payout_server: ServerProcess) -> str:
    return str(new_principal(payout_server.base_url, role="observer")["api_key"])


def payout(base_url: str, key: str, idem: str, amount: int = 500, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/payouts",
        json={"beneficiary": "ACME Supplies", "amount": amount, "currency": "EUR"},
        headers={**auth(key), "Idempotency-Key": idem},
        timeout=30,
        **kw,
    )


def status(base_url: str, key: str, operation_id: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/v1/operations/{operation_id}", headers=auth(key))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def sink(view: dict[str, Any]) -> str:
    return f"{view['id']}:{view['binding_generation']}"


def wait_for_state(base_url: str, key: str, operation_id: str, state: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(base_url, key, operation_id)["state"] == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"operation never reached {state}: {status(base_url, key, operation_id)}")


def evidence_for(view: dict[str, Any], *, reference: str, **overrides: Any) -> dict[str, Any]:
    """Signed evidence as an observer would deliver it (a completed payout by default)."""
    body = {
        "id": view["id"],
        "provider_reference": reference,
        "amount": 500,
        "currency": "EUR",
        "beneficiary": "ACME Supplies",
    }
    result = EvidenceResult(status=201, body=body)
    fields: dict[str, Any] = {
        "operation_id": uuid.UUID(view["id"]),
        "binding_generation": view["binding_generation"],
        "request_fingerprint": view["request_fingerprint"],
        "outcome": "completed",
        "result": result,
        "result_digest": result_digest(201, content_type_for("completed"), canonical(body)),
        "issued_at": datetime.now(UTC).isoformat(),
    }
    fields.update(overrides)
    evidence = Evidence(**fields)
    return {"evidence": msgspec.to_builtins(evidence), "signature": sign(evidence, SECRET)}


def metric(base_url: str, name: str) -> float:
    for line in httpx.get(f"{base_url}/metrics", headers=auth(ADMIN_KEY)).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not exported")


def observe(base_url: str, key: str, signed: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/observations", json=signed, headers=auth(key))


def test_payout_succeeds_once_and_replays(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    first = payout(payout_server.base_url, client_key, "p-ok")
    again = payout(payout_server.base_url, client_key, "p-ok")
    assert first.status_code == 201, first.text
    assert first.json()["provider_reference"].startswith("pay_")
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    view = status(payout_server.base_url, client_key, first.headers["operation-id"])
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
    assert paid() == 1


def test_mallory_under_the_victims_sink_key_is_refused_and_the_retry_pays_the_victim(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    """The victim's payout is left unknown; an attacker on the provider's network then asks
    for MALLORY under the victim's sink key, reservation tuple and fingerprint. Unsigned it
    is 401; signed with the shared secret it is still 422 (the fingerprint is not that
    payout's). Nothing is paid, so no evidence can settle it, and the victim's retry pays
    the victim's beneficiary, once."""
    provider.arm("error_5xx")
    unknown = payout(payout_server.base_url, client_key, "p-mallory")
    assert unknown.status_code == 504
    view = status(payout_server.base_url, client_key, unknown.headers["operation-id"])
    victims = PayoutRequest(beneficiary="ACME Supplies", amount=500, currency="EUR")
    assert view["request_fingerprint"] == payout_fingerprint(victims)  # the provider's function
    attack = msgspec.json.encode(
        {
            "operation_id": view["id"],
            "binding_generation": view["binding_generation"],
            "request_fingerprint": view["request_fingerprint"],
            "beneficiary": "MALLORY",
            "amount": 500,
            "currency": "EUR",
        }
    )

    unsigned = provider.post_payment(
        attack, {"Idempotency-Key": sink(view), "Content-Type": "application/json"}
    )
    insider = provider.post_payment(attack, signed_call(attack, sink(view)))

    assert unsigned.status_code == 401
    assert insider.status_code == 422
    assert provider.counts(sink(view)) == {"count": 0, "declines": 0}
    retry = payout(payout_server.base_url, client_key, "p-mallory")
    assert retry.status_code == 201, retry.text
    assert retry.json()["beneficiary"] == "ACME Supplies"
    settled = status(payout_server.base_url, client_key, view["id"])
    assert settled["state"] == "completed"
    assert settled["result"]["body"]["beneficiary"] == "ACME Supplies"
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
    assert paid() == 1


def test_lost_response_is_unknown_then_retry_gets_the_same_payment(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    provider.arm("drop_response")
    lost = payout(payout_server.base_url, client_key, "p-drop")
    assert lost.status_code == 504
    assert lost.json()["type"] == "/problems/operation-outcome-unknown"
    operation_id = lost.headers["operation-id"]
    assert status(payout_server.base_url, client_key, operation_id)["state"] == "unknown"

    retry = payout(payout_server.base_url, client_key, "p-drop")
    assert retry.status_code == 201, retry.text
    assert retry.headers["idempotent-replayed"] == "false"
    view = status(payout_server.base_url, client_key, operation_id)
    assert view["state"] == "completed"
    assert [a["outcome"] for a in view["attempts"]] == ["unknown", "completed"]
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
    assert paid() == 1


def test_late_answer_upgrades_unknown_without_a_retry(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    late_before = metric(payout_server.base_url, "settlement_late_responses_total")
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 3))
    timed_out = payout(payout_server.base_url, client_key, "p-late")
    assert timed_out.status_code == 504
    operation_id = timed_out.headers["operation-id"]

    wait_for_state(payout_server.base_url, client_key, operation_id, "completed", timeout=10)
    replay = payout(payout_server.base_url, client_key, "p-late")
    assert replay.status_code == 201
    assert replay.headers["idempotent-replayed"] == "true"
    view = status(payout_server.base_url, client_key, operation_id)
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
    assert paid() == 1
    assert metric(payout_server.base_url, "settlement_late_responses_total") == late_before + 1


def test_success_first_then_the_late_answer_keeps_completed(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    app_database: str,
) -> None:
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 3))
    timed_out = payout(payout_server.base_url, client_key, "p-race")
    assert timed_out.status_code == 504
    operation_id = timed_out.headers["operation-id"]
    # the retry reaches the provider while the first call is still delayed
    retry = payout(payout_server.base_url, client_key, "p-race")
    assert retry.status_code == 201, retry.text
    until(  # the first call's late answer arrives
        lambda: scalar(
            app_database,
            "SELECT count(*) FROM observations WHERE operation_id = :op"
            " AND source = 'late_response'",
            op=operation_id,
        ),
        "the late answer settled",
    )
    view = status(payout_server.base_url, client_key, operation_id)
    assert view["state"] == "completed"
    assert view["result"]["body"] == retry.json()
    late = scalar(
        app_database,
        "SELECT disposition FROM observations WHERE operation_id = :op"
        " AND source = 'late_response'",
        op=operation_id,
    )
    assert late == "strengthened"
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
    assert paid() == 1


def test_provider_5xx_is_unknown_then_retry_pays_once(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    provider.arm("error_5xx")
    failed = payout(payout_server.base_url, client_key, "p-5xx")
    assert failed.status_code == 504
    # what the provider said stays in the log: the client gets no internals
    detail = failed.json()["detail"]
    assert "503" not in detail and "provider answered" not in detail and "Error" not in detail
    view = status(payout_server.base_url, client_key, failed.headers["operation-id"])
    assert provider.counts(sink(view)) == {"count": 0, "declines": 0}
    assert paid() == 0
    retry = payout(payout_server.base_url, client_key, "p-5xx")
    assert retry.status_code == 201
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}


def test_decline_is_a_stored_402_and_recorded_once(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    provider.arm("decline")
    declined = payout(payout_server.base_url, client_key, "p-decline")
    again = payout(payout_server.base_url, client_key, "p-decline")
    assert declined.status_code == 402
    assert declined.json()["type"] == "/problems/payout-declined"
    assert again.status_code == 402
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == declined.content
    view = status(payout_server.base_url, client_key, declined.headers["operation-id"])
    assert view["state"] == "failed"
    assert provider.counts(sink(view)) == {"count": 0, "declines": 1}
    assert paid() == 0


def conflicting_evidence(
    server: ServerProcess, provider: ProviderProcess, client_key: str, observer_key: str, key: str
) -> tuple[str, dict[str, Any], tuple[httpx.Response, httpx.Response]]:
    """A payout left unknown (provider 5xx), then two observers' different completed
    evidence for it: the operation id, its status view, and the two answers."""
    provider.arm("error_5xx")
    unknown = payout(server.base_url, client_key, key)
    operation_id = unknown.headers["operation-id"]
    view = status(server.base_url, client_key, operation_id)
    other_observer = new_principal(server.base_url, role="observer")["api_key"]
    one = observe(server.base_url, observer_key, evidence_for(view, reference="pay_a"))
    two = observe(server.base_url, other_observer, evidence_for(view, reference="pay_b"))
    return operation_id, view, (one, two)


def test_conflicting_evidence_is_surfaced_never_overwritten(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    observer_key: str,
) -> None:
    conflicts_before = metric(payout_server.base_url, "settlement_conflicts_total")
    operation_id, view, (one, two) = conflicting_evidence(
        payout_server, provider, client_key, observer_key, "p-conflict"
    )

    assert one.status_code == 202 and one.json()["disposition"] == "applied"
    assert two.status_code == 202 and two.json()["disposition"] == "conflict"
    after = status(payout_server.base_url, client_key, operation_id)
    assert after["state"] == "conflict"
    assert len(set(after["conflict"]["digests"])) == 2
    retry = payout(payout_server.base_url, client_key, "p-conflict")
    assert retry.status_code == 409
    assert retry.json()["type"] == "/problems/operation-conflict"
    assert provider.counts(sink(view)) == {"count": 0, "declines": 0}
    assert paid() == 0
    assert metric(payout_server.base_url, "settlement_conflicts_total") == conflicts_before + 1


@pytest.mark.parametrize(
    "mismatch",
    [{"binding_generation": 2}, {"request_fingerprint": "0" * 64}],
    ids=["other-epoch", "other-fingerprint"],
)
def test_mismatched_evidence_is_quarantined_then_exact_match_applies(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    observer_key: str,
    mismatch: dict[str, Any],
) -> None:
    provider.arm("error_5xx")
    idem = f"p-quarantine-{next(iter(mismatch))}"
    unknown = payout(payout_server.base_url, client_key, idem)
    operation_id = unknown.headers["operation-id"]
    view = status(payout_server.base_url, client_key, operation_id)

    stale = observe(
        payout_server.base_url, observer_key, evidence_for(view, reference="pay_x", **mismatch)
    )
    assert stale.status_code == 202
    assert stale.json()["disposition"] == "quarantined"
    unchanged = status(payout_server.base_url, client_key, operation_id)
    assert unchanged["state"] == "unknown"
    assert unchanged["revision"] == view["revision"]

    exact = observe(payout_server.base_url, observer_key, evidence_for(view, reference="pay_x"))
    assert exact.status_code == 202
    assert exact.json()["disposition"] == "applied"
    assert status(payout_server.base_url, client_key, operation_id)["state"] == "completed"
    assert provider.counts(sink(view)) == {"count": 0, "declines": 0}
    assert paid() == 0


def test_forged_or_altered_evidence_is_422_and_changes_nothing(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    observer_key: str,
) -> None:
    provider.arm("error_5xx")
    unknown = payout(payout_server.base_url, client_key, "p-forged")
    operation_id = unknown.headers["operation-id"]
    view = status(payout_server.base_url, client_key, operation_id)

    forged = evidence_for(view, reference="pay_f")
    forged["signature"] = "0" * 64
    altered = evidence_for(view, reference="pay_f")
    altered["evidence"]["result"]["body"]["amount"] = 1_000_000
    for signed in (forged, altered):
        response = observe(payout_server.base_url, observer_key, signed)
        assert response.status_code == 422
        assert response.json()["type"] == "/problems/invalid-evidence"
    after = status(payout_server.base_url, client_key, operation_id)
    assert after["state"] == "unknown"
    assert after["revision"] == view["revision"]
    assert provider.counts(sink(view)) == {"count": 0, "declines": 0}
    assert paid() == 0


def test_evidence_about_a_local_effect_or_another_tenant_is_404(
    payout_server: ServerProcess, observer_key: str, client_key: str
) -> None:
    from tests.e2e.client import new_account

    source = new_account(payout_server.base_url, client_key, 10)
    dest = new_account(payout_server.base_url, client_key, 0)
    done = httpx.post(
        f"{payout_server.base_url}/v1/transfers",
        json={"source": source, "destination": dest, "amount": 20, "currency": "EUR"},
        headers={**auth(client_key), "Idempotency-Key": "local-effect"},
    )
    assert done.status_code == 402
    view = status(payout_server.base_url, client_key, done.headers["operation-id"])
    local = observe(payout_server.base_url, observer_key, evidence_for(view, reference="p"))
    assert local.status_code == 404
    after = status(payout_server.base_url, client_key, view["id"])
    assert after == view  # kept with the observer, listed under no operation

    elsewhere = new_principal(payout_server.base_url, tenant="elsewhere", role="observer")
    payout_view = status(
        payout_server.base_url,
        client_key,
        payout(payout_server.base_url, client_key, "p-tenant").headers["operation-id"],
    )
    foreign = observe(
        payout_server.base_url,
        elsewhere["api_key"],
        evidence_for(payout_view, reference="p_other"),
    )
    assert foreign.status_code == 404
    after = status(payout_server.base_url, client_key, payout_view["id"])
    assert after == payout_view


def test_evidence_for_an_unknown_operation_is_404(
    payout_server: ServerProcess, observer_key: str
) -> None:
    ghost = {
        "id": str(uuid.uuid4()),
        "binding_generation": 1,
        "request_fingerprint": "f" * 64,
    }
    response = observe(payout_server.base_url, observer_key, evidence_for(ghost, reference="p"))
    assert response.status_code == 404


def test_clients_may_not_deliver_evidence(payout_server: ServerProcess, client_key: str) -> None:
    response = httpx.post(
        f"{payout_server.base_url}/v1/observations", json={}, headers=auth(client_key)
    )
    assert response.status_code == 403


def test_killed_in_flight_payout_is_swept_and_retried_once(
    paid: Callable[[], int], services: Services, app_database: str, provider: ProviderProcess
) -> None:
    with ServerProcess(app_database, services.redis_url, env=_env(provider)) as setup:
        key = str(new_principal(setup.base_url)["api_key"])
    doomed = ServerProcess(
        app_database,
        services.redis_url,
        env=_env(provider, SETTLEMENT_PROVIDER_TIMEOUT="30"),
    ).start()
    provider.arm("delay", delay_ms=2500)
    try:
        threading.Thread(
            target=lambda: _swallow(lambda: payout(doomed.base_url, key, "p-killed")),
            daemon=True,
        ).start()
        deadline = time.monotonic() + 10
        operation_id = None
        while time.monotonic() < deadline and operation_id is None:
            found = httpx.get(
                f"{doomed.base_url}/v1/operations", params={"key": "p-killed"}, headers=auth(key)
            )
            if found.status_code == 200:
                operation_id = found.json()["id"]
            else:
                time.sleep(0.05)
        assert operation_id is not None
        # killed only once the provider holds the call (it took the armed delay): a server
        # killed before it sent the call leaves no payment to be made meanwhile
        until(lambda: not provider.faults(), "the provider holds the payout call")
    finally:
        doomed.stop(signal.SIGKILL)

    with ServerProcess(app_database, services.redis_url, env=_env(provider)) as restarted:
        started = time.monotonic()
        wait_for_state(
            restarted.base_url, key, operation_id, "unknown", timeout=LEASE_TTL + SWEEP_INTERVAL + 5
        )
        assert time.monotonic() - started <= LEASE_TTL + SWEEP_INTERVAL + 5
        view = status(restarted.base_url, key, operation_id)
        assert any(a["outcome"] is None for a in view["attempts"])  # the dead attempt
        # the delayed provider call commits its payment meanwhile
        until(lambda: provider.counts(sink(view))["count"] == 1, "the delayed payment made")
        retry = payout(restarted.base_url, key, "p-killed")
        assert retry.status_code == 201, retry.text
        assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
        assert paid() == 1


def _swallow(call: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):
        call()


def test_a_conflict_is_not_superseded_without_force_so_a_retry_never_pays_again(
    paid: Callable[[], int],
    payout_server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    observer_key: str,
) -> None:
    operation_id, _, _ = conflicting_evidence(
        payout_server, provider, client_key, observer_key, "p-conflict-supersede"
    )
    assert status(payout_server.base_url, client_key, operation_id)["state"] == "conflict"
    path = f"{payout_server.base_url}/admin/v1/operations/{operation_id}/supersede"

    refused = httpx.post(path, json={"reason": "x"}, headers=auth(ADMIN_KEY), timeout=30)
    assert refused.status_code == 409, refused.text
    assert refused.json()["type"] == "/problems/supersede-needs-force"
    assert refused.json()["state"] == "conflict"
    retry = payout(payout_server.base_url, client_key, "p-conflict-supersede")
    assert retry.json()["type"] == "/problems/operation-conflict"
    assert paid() == 0  # the evidence said it paid: nothing may pay again unasked

    forced = httpx.post(
        path, json={"reason": "x", "force": True}, headers=auth(ADMIN_KEY), timeout=30
    )
    assert forced.status_code == 200, forced.text
    assert forced.json()["effect_may_run_again"] is True
    again = payout(payout_server.base_url, client_key, "p-conflict-supersede")
    assert again.status_code == 201, again.text
    assert paid() == 1  # asked for with force: the new epoch pays under its own sink key
    assert provider.counts(f"{operation_id}:2")["count"] == 1


def test_a_waiting_request_hears_at_once_when_the_attempt_ends_without_an_outcome(
    payout_server: ServerProcess, provider: ProviderProcess, client_key: str
) -> None:
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 3))  # past the timeout
    first: list[httpx.Response] = []
    call = threading.Thread(
        target=lambda: first.append(payout(payout_server.base_url, client_key, "p-wait-unknown"))
    )
    call.start()
    until(  # the attempt has claimed the key and is calling the provider now
        lambda: (
            httpx.get(
                f"{payout_server.base_url}/v1/operations",
                params={"key": "p-wait-unknown"},
                headers=auth(client_key),
            ).status_code
            == 200
        ),
        "the first attempt claimed the key",
    )
    started = time.monotonic()
    waited = httpx.post(
        f"{payout_server.base_url}/v1/payouts",
        json={"beneficiary": "ACME Supplies", "amount": 500, "currency": "EUR"},
        headers={**auth(client_key), "Idempotency-Key": "p-wait-unknown", "Prefer": "wait=8"},
        timeout=30,
    )
    elapsed = time.monotonic() - started
    call.join(30)
    assert first[0].status_code == 504
    # woken when the attempt gave up (about PROVIDER_TIMEOUT), not after the 8 s asked for,
    # and told the real state
    assert elapsed < 5, elapsed
    assert waited.status_code == 409, waited.text
    assert waited.json()["state"] == "unknown"
