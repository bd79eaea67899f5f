"""An operation explains itself (issue 37 item 2), over HTTP against a real server and
provider process: the status resource shows what was asked (amounts in minor units), the
sink key a payout is sent under, why an ``unknown`` payout is unknown (the provider's 503,
its answer lost, a timeout with the setting's figure), what clients of a conflict are
answered with both conflicting results, and principals and admins by name beside their ids.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, execute, new_account, new_principal, transfer
from tests.e2e.console import signed_in_client
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess
from tests.e2e.test_payouts import evidence_for, observe, payout, sink, status

pytestmark = pytest.mark.e2e

PROVIDER_TIMEOUT = 0.8


@pytest.fixture(scope="module")
def server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
        "SETTLEMENT_PROVIDER_TIMEOUT": str(PROVIDER_TIMEOUT),
        "SETTLEMENT_LATE_RESPONSE_WINDOW": "10",
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> dict[str, Any]:
    return new_principal(server.base_url)


@pytest.fixture(autouse=True)
def no_faults(provider: ProviderProcess) -> Iterator[None]:
    provider.clear_faults()
    yield
    provider.clear_faults()


def by_key(base_url: str, key: str, idem: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/v1/operations", params={"key": idem}, headers=auth(key))
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def test_a_transfer_shows_what_was_asked_and_who_asked_it(
    server: ServerProcess, client: dict[str, Any]
) -> None:
    key = client["api_key"]
    source = new_account(server.base_url, key, 5000)
    destination = new_account(server.base_url, key, 0)
    done = transfer(server.base_url, key, "explain-transfer", source, destination, 1234)
    assert done.status_code == 201, done.text

    view = status(server.base_url, key, done.headers["operation-id"])
    assert view["request"] == {
        "source": source,
        "destination": destination,
        "amount": 1234,
        "currency": "EUR",
        "memo": None,
    }
    assert view["request_path"] is None
    assert view["principal_name"] == client["name"]
    assert view["sink_key"] is None  # a local effect is sent nowhere
    assert view["explanation"]["why"].startswith("completed")
    assert view["explanation"]["clients_answered"]["status"] == 201
    # the same by key, and every field the view had before is still there
    assert by_key(server.base_url, key, "explain-transfer")["request"] == view["request"]
    for field in ("id", "state", "request_fingerprint", "attempts", "epochs", "observations"):
        assert field in view


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ("error_5xx", "provider answered 503"),
        ("drop_response", "the provider closed the connection"),
        ("delay", f"timed out after {PROVIDER_TIMEOUT:g} s"),
    ],
    ids=["503", "answer-lost", "timeout"],
)
def test_an_unknown_payout_says_why_and_under_which_sink_key(
    server: ServerProcess, provider: ProviderProcess, client: dict[str, Any], fault: str, said: str
) -> None:
    key = client["api_key"]
    provider.arm(fault, delay_ms=3000 if fault == "delay" else None)
    idem = f"explain-{fault}-{uuid.uuid4().hex[:6]}"
    lost = payout(server.base_url, key, idem, amount=777)
    assert lost.status_code == 504, lost.text

    view = status(server.base_url, key, lost.headers["operation-id"])
    assert view["state"] == "unknown"
    assert view["request"] == {"beneficiary": "ACME Supplies", "amount": 777, "currency": "EUR"}
    assert view["sink_key"] == sink(view) == f"{view['id']}:1"
    explanation = view["explanation"]
    assert said in explanation["last_error"], explanation
    assert "Error" not in explanation["last_error"]  # a fixed sentence, no exception's text
    assert said in explanation["why"] and "retry" in explanation["why"]
    (attempt,) = view["attempts"]
    assert attempt["error"] == explanation["last_error"]
    # the client's own answer names none of it (a provider's status stays on the server)
    assert said not in lost.text


def test_a_conflict_shows_what_clients_are_answered_and_both_results(
    server: ServerProcess, provider: ProviderProcess, client: dict[str, Any]
) -> None:
    key = client["api_key"]
    provider.arm("error_5xx")
    unknown = payout(server.base_url, key, "explain-conflict")
    assert unknown.status_code == 504, unknown.text
    view = status(server.base_url, key, unknown.headers["operation-id"])
    first = new_principal(server.base_url, role="observer")["api_key"]
    second = new_principal(server.base_url, role="observer")["api_key"]
    assert observe(server.base_url, first, evidence_for(view, reference="pay_a")).status_code == 202
    assert (
        observe(server.base_url, second, evidence_for(view, reference="pay_b")).status_code == 202
    )

    after = status(server.base_url, key, view["id"])
    assert after["state"] == "conflict"
    explanation = after["explanation"]
    assert explanation["clients_answered"] == {
        "status": 409,
        "type": "/problems/operation-conflict",
        "title": explanation["clients_answered"]["title"],
    }
    retry = payout(server.base_url, key, "explain-conflict")
    assert retry.status_code == 409
    assert retry.json()["type"] == explanation["clients_answered"]["type"]
    one, two = explanation["conflicting_results"]
    assert [one["digest"], two["digest"]] == after["conflict"]["digests"]
    assert one["digest"] != two["digest"]
    assert (one["kind"], two["kind"]) == ("completed", "completed")
    assert one["status"] == two["status"] == 201
    assert one["stored"] and not two["stored"]
    assert one["body"]["provider_reference"] == "pay_a" and two["body"] is None
    assert "409" in explanation["why"]


def test_a_supersede_and_a_resolution_name_their_admins(
    server: ServerProcess, provider: ProviderProcess, client: dict[str, Any]
) -> None:
    key = client["api_key"]
    admin = new_principal(server.base_url, role="admin")
    provider.arm("error_5xx")
    unknown = payout(server.base_url, key, "explain-names")
    operation_id = unknown.headers["operation-id"]
    superseded = httpx.post(
        f"{server.base_url}/admin/v1/operations/{operation_id}/supersede",
        json={"reason": "retry under a new epoch", "force": True},
        headers=auth(admin["api_key"]),
    )
    assert superseded.status_code == 200, superseded.text
    provider.arm("error_5xx")
    assert payout(server.base_url, key, "explain-names").status_code == 504
    view = status(server.base_url, key, operation_id)
    resolved = httpx.post(
        f"{server.base_url}/admin/v1/operations/{operation_id}/resolve",
        json={
            "outcome": "failed",
            "provider_reference": "none",
            "reason": "the provider has no record of it",
            "result": {"status": 402, "body": {"declined": True}},
        },
        headers=auth(admin["api_key"]),
    )
    assert resolved.status_code == 200, resolved.text

    after = status(server.base_url, key, operation_id)
    (epoch,) = after["epochs"]
    assert epoch["superseded_by"] == admin["id"]
    assert epoch["superseded_by_name"] == admin["name"]
    (resolution,) = [seen for seen in after["observations"] if seen["source"] == "admin"]
    assert resolution["admin_name"] == admin["name"]
    assert after["sink_key"] == f"{operation_id}:2" != sink(view | {"binding_generation": 1})


def test_an_operation_claimed_before_requests_were_kept_says_so(
    server: ServerProcess, app_database: str, client: dict[str, Any]
) -> None:
    """A row from before migration 0017 (its canonical_request NULL): the status resource
    answers ``request: null`` beside every other field, the console says it was not recorded."""
    key = client["api_key"]
    source = new_account(server.base_url, key, 100)
    destination = new_account(server.base_url, key, 0)
    done = transfer(server.base_url, key, "explain-old-row", source, destination, 5)
    assert done.status_code == 201, done.text
    operation_id = done.headers["operation-id"]
    execute(
        app_database, "UPDATE operations SET canonical_request = NULL WHERE id = :i", i=operation_id
    )

    view = status(server.base_url, key, operation_id)
    assert view["request"] is None and view["state"] == "completed"
    assert view["principal_name"] == client["name"]
    with signed_in_client(server.base_url, ADMIN_KEY) as console:
        page = console.get(f"/console/operations/{operation_id}")
    assert page.status_code == 200
    assert "Request not recorded" in page.text
