"""Reservation epochs: credential rotation, admin supersede, and what the old epoch may still
say afterwards. Real server processes, PostgreSQL, Redis and provider."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, balance, new_account, new_principal, scalar, transfer
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

PROVIDER_TIMEOUT = 0.8
ENV = {
    "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
    "SETTLEMENT_LEASE_TTL": "1",
    "SETTLEMENT_PROVIDER_SECRET": SECRET,
    "SETTLEMENT_PROVIDER_TIMEOUT": str(PROVIDER_TIMEOUT),
    "SETTLEMENT_LATE_RESPONSE_WINDOW": "10",
}


@pytest.fixture(scope="module")
def epoch_server(
    services: Services, app_database: str, provider: ProviderProcess
) -> Iterator[ServerProcess]:
    env = {**ENV, "SETTLEMENT_PROVIDER_URL": provider.base_url}
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


def admin(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, headers=auth(ADMIN_KEY), timeout=30)


def status(base_url: str, key: str, operation_id: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/v1/operations/{operation_id}", headers=auth(key))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def transfers_of(database_url: str, source: str) -> int:
    return int(
        scalar(database_url, "SELECT count(*) FROM transfers WHERE source_id = :s", s=source)
    )


def unknown_transfer(
    services: Services, database_url: str, key: str, idem: str, source: str, dest: str, amount: int
) -> str:
    """A transfer whose only attempt failed on a bug: the operation is left unknown."""
    env = {
        **ENV,
        "SETTLEMENT_ENABLE_FAILPOINTS": "1",
        "SETTLEMENT_FAILPOINTS": "effect.before_commit=error",
    }
    with ServerProcess(database_url, services.redis_url, env=env) as broken:
        failed = transfer(broken.base_url, key, idem, source, dest, amount)
    assert failed.status_code == 500, failed.text
    return str(failed.headers["operation-id"])


def test_rotation_then_supersede_with_rebind_executes_once(
    services: Services, app_database: str, epoch_server: ServerProcess
) -> None:
    base = epoch_server.base_url
    owner = new_principal(base)
    old_key = owner["api_key"]
    source, dest = new_account(base, old_key, 100), new_account(base, old_key, 0)
    operation_id = unknown_transfer(services, app_database, old_key, "rot", source, dest, 10)

    rotated = admin(base, f"/admin/v1/principals/{owner['id']}/rotate", {})
    assert rotated.status_code == 200, rotated.text
    new_key = rotated.json()["api_key"]
    assert rotated.json()["credential_generation"] == 2

    assert transfer(base, old_key, "rot", source, dest, 10).status_code == 401
    mismatch = transfer(base, new_key, "rot", source, dest, 10)
    assert mismatch.status_code == 409
    assert mismatch.json()["type"] == "/problems/binding-mismatch"
    assert transfers_of(app_database, source) == 0

    superseded = admin(
        base, f"/admin/v1/operations/{operation_id}/supersede", {"reason": "credential rotated"}
    )
    assert superseded.status_code == 200, superseded.text
    view = superseded.json()["operation"]
    assert view["binding_generation"] == 2
    assert view["state"] == "unknown"
    assert [e["binding_generation"] for e in view["epochs"]] == [1]
    assert view["epochs"][0]["reason"] == "credential rotated"
    assert view["epochs"][0]["final_state"] == "unknown"

    done = transfer(base, new_key, "rot", source, dest, 10)
    again = transfer(base, new_key, "rot", source, dest, 10)
    assert done.status_code == 201 and done.headers["idempotent-replayed"] == "false"
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert transfers_of(app_database, source) == 1
    assert balance(base, new_key, source) == 90


def test_supersede_with_an_edited_request(
    services: Services, app_database: str, epoch_server: ServerProcess
) -> None:
    base = epoch_server.base_url
    key = new_principal(base)["api_key"]
    source, dest = new_account(base, key, 100), new_account(base, key, 0)
    operation_id = unknown_transfer(services, app_database, key, "edit", source, dest, 10)
    edited = {"source": source, "destination": dest, "amount": 25, "currency": "EUR"}

    bad = admin(
        base,
        f"/admin/v1/operations/{operation_id}/supersede",
        {"reason": "amount corrected", "request": {**edited, "amount": -1}},
    )
    assert bad.status_code == 400
    assert status(base, key, operation_id)["binding_generation"] == 1

    ok = admin(
        base,
        f"/admin/v1/operations/{operation_id}/supersede",
        {"reason": "amount corrected", "request": edited},
    )
    assert ok.status_code == 200, ok.text
    old_body = transfer(base, key, "edit", source, dest, 10)
    assert old_body.status_code == 422
    assert old_body.json()["type"] == "/problems/fingerprint-mismatch"
    new_body = transfer(base, key, "edit", source, dest, 25)
    assert new_body.status_code == 201, new_body.text
    assert transfer(base, key, "edit", source, dest, 25).headers["idempotent-replayed"] == "true"
    assert transfers_of(app_database, source) == 1
    assert balance(base, key, source) == 75


def test_completed_needs_force_and_force_runs_the_effect_once_more(
    app_database: str, epoch_server: ServerProcess
) -> None:
    base = epoch_server.base_url
    key = new_principal(base)["api_key"]
    source, dest = new_account(base, key, 100), new_account(base, key, 0)
    first = transfer(base, key, "again", source, dest, 10)
    operation_id = first.headers["operation-id"]
    before = status(base, key, operation_id)

    refused = admin(
        base, f"/admin/v1/operations/{operation_id}/supersede", {"reason": "customer asked"}
    )
    assert refused.status_code == 409
    assert refused.json()["type"] == "/problems/supersede-needs-force"
    assert status(base, key, operation_id) == before

    forced = admin(
        base,
        f"/admin/v1/operations/{operation_id}/supersede",
        {"reason": "customer asked", "force": True},
    )
    assert forced.status_code == 200, forced.text
    assert forced.json()["effect_may_run_again"] is True
    assert forced.json()["operation"]["epochs"][0]["final_state"] == "completed"

    rerun = transfer(base, key, "again", source, dest, 10)
    replay = transfer(base, key, "again", source, dest, 10)
    assert rerun.status_code == 201 and rerun.headers["idempotent-replayed"] == "false"
    assert rerun.content != first.content  # a new transfer
    assert replay.headers["idempotent-replayed"] == "true"
    assert transfers_of(app_database, source) == 2
    assert balance(base, key, source) == 80


def test_late_success_of_the_old_epoch_is_quarantined(
    app_database: str, epoch_server: ServerProcess, provider: ProviderProcess
) -> None:
    base = epoch_server.base_url
    key = new_principal(base)["api_key"]
    body = {"beneficiary": "ACME", "amount": 700, "currency": "EUR"}
    headers = {**auth(key), "Idempotency-Key": "late-old-epoch"}
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 3))
    timed_out = httpx.post(f"{base}/v1/payouts", json=body, headers=headers, timeout=30)
    assert timed_out.status_code == 504
    operation_id = timed_out.headers["operation-id"]

    path = f"/admin/v1/operations/{operation_id}/supersede"
    refused = admin(base, path, {"reason": "new epoch"})
    assert refused.status_code == 409  # the first epoch may pay: that must be accepted
    assert refused.json()["type"] == "/problems/supersede-needs-force"
    superseded = admin(base, path, {"reason": "new epoch", "force": True})
    assert superseded.status_code == 200, superseded.text
    assert superseded.json()["effect_may_run_again"] is True
    # the first epoch's payment answers late: wait until its observation is written and
    # counted (the provider's delay is 3 x the timeout)
    late_row = (
        "SELECT max(disposition) FROM observations WHERE operation_id = :op"
        " AND source = 'late_response'"
    )
    counted = "settlement_stale_epoch_outcomes_total 1.0"
    deadline = time.monotonic() + PROVIDER_TIMEOUT * 3 + 10
    while scalar(app_database, late_row, op=operation_id) is None or counted not in (
        httpx.get(f"{base}/metrics", headers=auth(ADMIN_KEY)).text.splitlines()
    ):
        assert time.monotonic() < deadline, "the late answer was never observed"
        time.sleep(0.05)

    view = status(base, key, operation_id)
    assert view["state"] == "unknown"
    assert view["binding_generation"] == 2
    assert scalar(app_database, late_row, op=operation_id) == "quarantined"
    stale = httpx.get(f"{base}/metrics", headers=auth(ADMIN_KEY)).text
    assert counted in stale.splitlines()

    paid = httpx.post(f"{base}/v1/payouts", json=body, headers=headers, timeout=30)
    assert paid.status_code == 201, paid.text
    assert status(base, key, operation_id)["state"] == "completed"
    assert provider.counts(f"{operation_id}:1") == {"count": 1, "declines": 0}
    assert provider.counts(f"{operation_id}:2") == {"count": 1, "declines": 0}


def test_admin_work_list_pages_and_is_tenant_scoped(
    services: Services, app_database: str, epoch_server: ServerProcess
) -> None:
    base = epoch_server.base_url
    key = new_principal(base, tenant="worklist")["api_key"]
    source, dest = new_account(base, key, 100), new_account(base, key, 0)
    ids = {
        unknown_transfer(services, app_database, key, f"wl-{i}", source, dest, 1) for i in range(3)
    }
    seen: list[str] = []
    after = None
    while True:
        params = {"state": "unknown", "tenant": "worklist", "limit": "2"}
        if after:
            params["after"] = after
        page = httpx.get(f"{base}/admin/v1/operations", params=params, headers=auth(ADMIN_KEY))
        assert page.status_code == 200, page.text
        seen += [item["id"] for item in page.json()["items"]]
        after = page.json()["next"]
        if after is None:
            break
    assert set(seen) == ids and len(seen) == 3

    other_admin = httpx.post(
        f"{base}/admin/v1/principals",
        json={"tenant": "elsewhere", "name": "ops", "role": "admin"},
        headers=auth(ADMIN_KEY),
    ).json()["api_key"]
    mine = httpx.get(
        f"{base}/admin/v1/operations", params={"state": "unknown"}, headers=auth(other_admin)
    )
    assert mine.status_code == 200 and mine.json()["items"] == []
    foreign = httpx.get(
        f"{base}/admin/v1/operations",
        params={"state": "unknown", "tenant": "worklist"},
        headers=auth(other_admin),
    )
    assert foreign.status_code == 403
    bad = httpx.get(
        f"{base}/admin/v1/operations", params={"state": "done"}, headers=auth(ADMIN_KEY)
    )
    assert bad.status_code == 400


def test_a_payout_that_answers_after_a_forced_supersede_says_so(
    app_database: str, epoch_server: ServerProcess, provider: ProviderProcess
) -> None:
    base = epoch_server.base_url
    key = new_principal(base)["api_key"]
    body = {"beneficiary": "ACME", "amount": 300, "currency": "EUR"}
    headers = {**auth(key), "Idempotency-Key": "superseded-in-flight"}
    provider.arm("delay", delay_ms=int(PROVIDER_TIMEOUT * 1000 * 0.7))  # answers in time
    answers: list[httpx.Response] = []
    call = threading.Thread(
        target=lambda: answers.append(
            httpx.post(f"{base}/v1/payouts", json=body, headers=headers, timeout=30)
        )
    )
    call.start()
    claimed = "SELECT count(*) FROM operations WHERE idempotency_key = 'superseded-in-flight'"
    deadline = time.monotonic() + 5
    while scalar(app_database, claimed) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    operation_id = scalar(
        app_database,
        "SELECT id::text FROM operations WHERE idempotency_key = 'superseded-in-flight'",
    )
    superseded = admin(
        base, f"/admin/v1/operations/{operation_id}/supersede", {"reason": "x", "force": True}
    )
    assert superseded.status_code == 200, superseded.text
    assert superseded.json()["fenced_live_attempt"] is True
    call.join(30)

    (answer,) = answers
    # the lease was revoked and the attempt told what happened: not "in progress"
    assert answer.status_code == 409, answer.text
    assert answer.json()["type"] == "/problems/operation-superseded"
    assert answer.json()["operation_id"] == operation_id
    # the old epoch's payment still lands under its own sink key, and is kept as an
    # observation of that epoch (quarantined: the row is epoch 2's)
    kept = (
        "SELECT count(*) FROM observations WHERE operation_id = :op AND binding_generation = 1"
        " AND kind = 'completed' AND disposition = 'quarantined'"
    )
    deadline = time.monotonic() + 10
    while scalar(app_database, kept, op=operation_id) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scalar(app_database, kept, op=operation_id) == 1
    assert provider.counts(f"{operation_id}:1")["count"] == 1
    assert status(base, key, operation_id)["binding_generation"] == 2
