"""An operator resolves a stuck operation (``POST /admin/v1/operations/{id}/resolve``), over
HTTP, with a real provider process: the resolution replays to the client's next retry, races
a late provider answer into one outcome, stays in its tenant, refuses bad bodies, and never
overwrites a terminal outcome. The provider's count of payments is asserted in each test.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgspec
import pytest
from settlement_client import AdminClient, AsyncAdminClient
from settlement_client.problems import ResolutionRefused

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, new_principal, scalar, until
from tests.e2e.console import form_token, signed_in_client
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess
from tests.e2e.test_payouts import evidence_for, observe, payout, sink, status

pytestmark = pytest.mark.e2e

PROVIDER_TIMEOUT = 0.8
PAYOUT = {"beneficiary": "ACME Supplies", "amount": 500, "currency": "EUR"}


@pytest.fixture(autouse=True)
def paid(provider: ProviderProcess) -> Iterator[Callable[[], int]]:
    provider.clear_faults()
    before = provider.total()
    yield lambda: provider.total() - before
    provider.clear_faults()


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
        "SETTLEMENT_LEASE_TTL": "1",
        "SETTLEMENT_SWEEP_INTERVAL": "0.5",
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def client_key(server: ServerProcess) -> str:
    return str(new_principal(server.base_url)["api_key"])


@pytest.fixture(scope="module")
def tenant_admin(server: ServerProcess) -> str:
    """An admin of the client's tenant (acme), not the bootstrap one."""
    return str(new_principal(server.base_url, role="admin")["api_key"])


def resolve(base_url: str, key: str, operation_id: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{base_url}/admin/v1/operations/{operation_id}/resolve",
        json=body,
        headers=auth(key),
        timeout=30,
    )


def resolution(
    body: dict[str, Any], outcome: str = "completed", status: int = 201, reference: str = "pay_1"
) -> dict[str, Any]:
    return {
        "outcome": outcome,
        "provider_reference": reference,
        "reason": "provider dashboard shows the payment settled",
        "result": {"status": status, "body": body},
    }


def payout_body(view: dict[str, Any], reference: str) -> dict[str, Any]:
    return {"id": view["id"], "provider_reference": reference, **PAYOUT}


def unknown_payout(
    server: ServerProcess, provider: ProviderProcess, key: str, idem: str, mode: str = "error_5xx"
) -> str:
    """A payout left ``unknown``: the provider failed (5xx: nothing paid) or its answer was
    lost (``drop_response``: paid)."""
    provider.arm(mode)
    lost = payout(server.base_url, key, idem)
    assert lost.status_code == 504, lost.text
    return str(lost.headers["operation-id"])


def provider_record(provider: ProviderProcess, view: dict[str, Any]) -> dict[str, Any]:
    """What the operator reads from the provider: the payment under the operation's sink key
    (the same signed request the server sent, so the provider replays it, never pays)."""
    body = {
        "operation_id": view["id"],
        "binding_generation": view["binding_generation"],
        "request_fingerprint": view["request_fingerprint"],
        **PAYOUT,
    }
    answer = provider.pay(body, sink(view), timeout=30)
    assert answer.status_code == 201, answer.text
    evidence: dict[str, Any] = answer.json()["evidence"]
    return evidence


def test_a_resolved_unknown_payout_replays_to_the_clients_next_retry(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    tenant_admin: str,
) -> None:
    operation_id = unknown_payout(server, provider, client_key, "resolve-lost", "drop_response")
    view = status(server.base_url, client_key, operation_id)
    assert view["state"] == "unknown" and paid() == 1  # paid, the answer lost
    record = provider_record(provider, view)

    with AdminClient(server.base_url, tenant_admin) as admin:
        answer = admin.resolve(
            operation_id,
            "completed",
            provider_reference="pay_from_dashboard",
            reason="the provider's record shows it paid",
            status=record["result"]["status"],
            body=record["result"]["body"],
        )
    assert answer.status == 200
    assert answer.value.disposition == "applied"
    assert answer.value.operation.state == "completed"

    retry = payout(server.base_url, client_key, "resolve-lost")
    assert retry.status_code == 201, retry.text
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.json() == record["result"]["body"]
    assert paid() == 1  # the retry replayed: nothing paid again

    after = status(server.base_url, client_key, operation_id)
    assert after["result"]["digest"] == record["result_digest"]  # the provider's own digest
    settled = [o for o in after["observations"] if o["source"] == "admin"]
    assert len(settled) == 1 and settled[0]["disposition"] == "applied"
    detail = settled[0]["detail"]
    assert detail["resolution"] == "completed"
    assert detail["reason"] == "the provider's record shows it paid"
    assert detail["provider_reference"] == "pay_from_dashboard"
    assert detail["admin_name"].startswith("admin-")
    assert detail["state_before"] == "unknown"
    assert settled[0]["created_at"]


def test_resolving_twice_strengthens_and_a_terminal_outcome_is_never_overwritten(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    tenant_admin: str,
) -> None:
    operation_id = unknown_payout(server, provider, client_key, "resolve-twice")
    view = status(server.base_url, client_key, operation_id)
    declined = {"type": "/problems/payout-declined", "title": "Payout declined", "status": 402}
    body = resolution(declined, outcome="failed", status=402)
    first = resolve(server.base_url, tenant_admin, operation_id, body)
    assert first.status_code == 200, first.text
    assert first.json()["disposition"] == "applied"
    assert first.json()["operation"]["state"] == "failed"

    again = resolve(server.base_url, tenant_admin, operation_id, body)
    assert again.status_code == 200, again.text
    assert again.json()["disposition"] == "strengthened"

    other = resolve(server.base_url, tenant_admin, operation_id, resolution(payout_body(view, "x")))
    assert other.status_code == 409, other.text
    problem = other.json()
    assert problem["type"] == "/problems/resolution-refused"
    assert problem["state"] == "failed"
    assert "terminal-not-overwritten" in problem["detail"]

    retry = payout(server.base_url, client_key, "resolve-twice")
    assert retry.status_code == 402 and retry.json() == declined
    assert retry.headers["idempotent-replayed"] == "true"
    assert (
        status(server.base_url, client_key, operation_id)["revision"]
        == first.json()["operation"]["revision"]
    )
    assert paid() == 0

    # a payout that completed by itself is not the operator's to change either
    done = payout(server.base_url, client_key, "resolve-completed")
    assert done.status_code == 201
    refused = resolve(
        server.base_url, ADMIN_KEY, done.headers["operation-id"], resolution({"id": "x"})
    )
    assert refused.status_code == 409
    assert refused.json()["type"] == "/problems/resolution-refused"


def test_a_resolution_racing_the_late_provider_answer_ends_in_one_outcome(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    tenant_admin: str,
    app_database: str,
) -> None:
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 3))
    timed_out = payout(server.base_url, client_key, "resolve-race")
    assert timed_out.status_code == 504
    operation_id = timed_out.headers["operation-id"]
    view = status(server.base_url, client_key, operation_id)
    # the operator reads the provider's record (answered once the delayed payment commits,
    # when the server's late answer arrives too) and resolves from it at once
    record = provider_record(provider, view)
    resolved = resolve(
        server.base_url,
        tenant_admin,
        operation_id,
        resolution(record["result"]["body"], reference="pay_race"),
    )
    assert resolved.status_code == 200, resolved.text

    def sources() -> dict[str, str]:
        rows = scalar(
            app_database,
            "SELECT coalesce(string_agg(source || '=' || disposition, ','), '')"
            " FROM observations"
            " WHERE operation_id = :op AND source IN ('late_response', 'admin')",
            op=operation_id,
        )
        return dict(pair.split("=") for pair in rows.split(",") if pair)

    decided = until(lambda: len(sources()) == 2 and sources(), "the late answer settled")
    assert sorted(decided.values()) == ["applied", "strengthened"]
    after = status(server.base_url, client_key, operation_id)
    assert after["state"] == "completed"
    assert after["result"]["digest"] == record["result_digest"]
    retry = payout(server.base_url, client_key, "resolve-race")
    assert retry.status_code == 201 and retry.json() == record["result"]["body"]
    assert provider.counts(sink(view)) == {"count": 1, "declines": 0}
    assert paid() == 1


def test_a_conflict_is_resolved_to_one_of_its_outcomes_and_stays_resolved(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    tenant_admin: str,
) -> None:
    operation_id = unknown_payout(server, provider, client_key, "resolve-conflict")
    view = status(server.base_url, client_key, operation_id)
    observers = [new_principal(server.base_url, role="observer")["api_key"] for _ in range(2)]
    one, two = (evidence_for(view, reference=ref) for ref in ("pay_a", "pay_b"))
    assert observe(server.base_url, observers[0], one).json()["disposition"] == "applied"
    assert observe(server.base_url, observers[1], two).json()["disposition"] == "conflict"

    wrong = resolve(
        server.base_url,
        tenant_admin,
        operation_id,
        resolution({"type": "/problems/payout-declined"}, outcome="failed", status=402),
    )
    assert wrong.status_code == 409
    assert "not-a-conflicting-outcome" in wrong.json()["detail"]

    chosen = one["evidence"]["result"]["body"]

    async def resolve_async() -> str:
        async with AsyncAdminClient(server.base_url, tenant_admin) as admin:
            answer = await admin.resolve(
                operation_id,
                "completed",
                provider_reference="pay_a",
                reason="the provider has pay_a; pay_b is a test payment",
                status=201,
                body=chosen,
            )
            return answer.value.operation.state

    assert asyncio.run(resolve_async()) == "completed"
    retry = payout(server.base_url, client_key, "resolve-conflict")
    assert retry.status_code == 201 and retry.json() == chosen
    # the other observer says its piece again: the operator chose already
    replayed = observe(server.base_url, observers[1], two)
    assert replayed.json()["disposition"] == "ignored"
    assert replayed.json()["reason"] == "conflict-already-resolved"
    assert status(server.base_url, client_key, operation_id)["state"] == "completed"
    with AdminClient(server.base_url, tenant_admin) as admin, pytest.raises(ResolutionRefused):
        admin.resolve(
            operation_id,
            "completed",
            provider_reference="pay_b",
            reason="changed my mind",
            status=201,
            body=two["evidence"]["result"]["body"],
        )
    assert paid() == 0


def test_another_tenants_admin_cannot_resolve_and_learns_nothing(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    operation_id = unknown_payout(server, provider, client_key, "resolve-tenant")
    before = status(server.base_url, client_key, operation_id)
    stranger = new_principal(server.base_url, tenant="globex", role="admin")["api_key"]
    client = client_key
    body = resolution(payout_body(before, "pay_x"))
    for key in (stranger, client):
        answer = resolve(server.base_url, key, operation_id, body)
        assert answer.status_code in (403, 404), answer.text
    missing = resolve(server.base_url, stranger, operation_id, body)
    nowhere = resolve(server.base_url, stranger, "00000000-0000-4000-8000-000000000000", body)
    assert missing.status_code == nowhere.status_code == 404
    assert missing.json()["type"] == nowhere.json()["type"] == "/problems/not-found"
    assert status(server.base_url, client_key, operation_id) == before
    assert paid() == 0


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"outcome": "completed", "provider_reference": "p", "reason": "r"},
        {**resolution({"id": "x"}), "outcome": "unknown"},
        {**resolution({"id": "x"}), "extra": 1},
        resolution({"id": "x"}, status=402),
        resolution({"id": "x"}, outcome="failed", status=201),
        resolution({"id": "x"}, outcome="failed", status=500),
        {**resolution({"id": "x"}), "reason": ""},
        {**resolution({"id": "x"}), "provider_reference": "a\nb"},
        {**resolution({"id": "x"}), "result": {"status": 201, "body": [1]}},
        resolution({"blob": "x" * 70_000}),
        "not an object",
    ],
)
def test_a_bad_body_is_400_and_changes_nothing(
    server: ServerProcess, provider: ProviderProcess, client_key: str, body: Any
) -> None:
    operation_id = unknown_payout(server, provider, client_key, f"resolve-bad-{uuid.uuid4()}")
    before = status(server.base_url, client_key, operation_id)
    answer = httpx.post(
        f"{server.base_url}/admin/v1/operations/{operation_id}/resolve",
        content=msgspec.json.encode(body),
        headers={**auth(ADMIN_KEY), "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "/problems/validation-error"
    assert status(server.base_url, client_key, operation_id) == before


def test_a_live_attempt_is_left_to_settle_its_own_operation(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
) -> None:
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 3))  # past the timeout
    answers: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: answers.append(payout(server.base_url, client_key, "resolve-live"))
    )
    worker.start()

    def in_flight() -> str | None:
        found = httpx.get(
            f"{server.base_url}/v1/operations",
            params={"key": "resolve-live"},
            headers=auth(client_key),
        )
        view = found.json() if found.status_code == 200 else {}
        return str(view["id"]) if view.get("state") == "in_progress" else None

    operation_id = until(in_flight, "the attempt in flight")
    refused = resolve(server.base_url, ADMIN_KEY, operation_id, resolution({"id": "x"}))
    worker.join()
    assert refused.status_code == 409, refused.text
    assert refused.json()["type"] == "/problems/resolution-refused"
    assert "attempt-live" in refused.json()["detail"]
    assert answers[0].status_code == 504  # the attempt ended unknown; its late answer settles it
    until(lambda: status(server.base_url, client_key, operation_id)["state"] == "completed", "late")
    assert paid() == 1


def test_the_console_resolve_form_keeps_the_form_token_and_tenant_rules(
    paid: Callable[[], int],
    server: ServerProcess,
    provider: ProviderProcess,
    client_key: str,
    tenant_admin: str,
) -> None:
    base = server.base_url
    operation_id = unknown_payout(server, provider, client_key, "resolve-console")
    before = status(base, client_key, operation_id)
    path = f"/console/operations/{operation_id}/resolve"
    fields = {
        "outcome": "completed",
        "provider_reference": "pay_console",
        "status": "201",
        "body": msgspec.json.encode(payout_body(before, "pay_console")).decode(),
        "reason": "the provider's record",
    }
    stranger = new_principal(base, tenant="globex", role="admin")["api_key"]
    with signed_in_client(base, stranger) as client:
        page = client.get("/console")
        refused = client.post(path, data={"csrf": form_token(page.text), **fields})
        assert refused.status_code == 404, refused.text
    with signed_in_client(base, tenant_admin) as client:
        page = client.get(f"/console/operations/{operation_id}")
        assert 'id="resolve-form"' in page.text
        forged = client.post(path, data=fields)
        assert forged.status_code == 403 and "Form refused" in forged.text
        wrong = client.post(path, data={"csrf": "0" * 43, **fields})
        assert wrong.status_code == 403
        assert status(base, client_key, operation_id) == before
        token = form_token(page.text, "resolve-form")
        for status_typed in ("abc", "²01", "2_01", "2010", ""):
            bad = client.post(path, data={"csrf": token, **fields, "status": status_typed})
            assert bad.status_code == 400, status_typed
            assert "the status must be an HTTP status code, three digits" in bad.text
            assert "invalid literal" not in bad.text
        assert status(base, client_key, operation_id) == before
        done = client.post(path, data={"csrf": token, **fields})
        assert done.status_code == 200, done.text
        assert "Resolved as completed (applied)" in done.text
        assert "Operator resolution: completed, applied" in done.text
        assert 'id="resolve-form"' not in done.text
        again = client.post(path, data={"csrf": token, **fields, "body": '{"id": "other"}'})
        assert again.status_code == 409 and "terminal-not-overwritten" in again.text
        assert 'value="pay_console"' in again.text  # the refused form keeps what was typed
    assert status(base, client_key, operation_id)["state"] == "completed"
    assert paid() == 0
