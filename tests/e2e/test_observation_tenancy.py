"""Observations stay in their tenant, are capped per observer, and page on the status view.

The attack of the security review (item 2), over a real server and provider: an observer of
tenant A posts forged documents naming tenant B's payout. None of them is listed in B's
history, A's principal id appears nowhere B looks, and B's settling observation is shown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, new_principal, scalar
from tests.e2e.console import signed_in_client
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess
from tests.e2e.test_payouts import evidence_for, observe, payout, status

pytestmark = pytest.mark.e2e

# the server's defaults (service/config.py): the tests prove the shipped numbers
QUARANTINE_LIMIT = 100
QUARANTINE_WINDOW = 3600
PAGE = 100  # service.store.status.MAX_OBSERVATIONS


@pytest.fixture(scope="module")
def base_url(services: Services, app_database: str, provider: ProviderProcess) -> Iterator[str]:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc.base_url


def _tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _paid(base_url: str, client_key: str) -> dict[str, Any]:
    """A completed payout of the client's, as its status resource shows it."""
    answer = payout(base_url, client_key, uuid.uuid4().hex)
    assert answer.status_code == 201, answer.text
    return status(base_url, client_key, answer.headers["operation-id"])


def _forged(view: dict[str, Any], n: int) -> dict[str, Any]:
    """Evidence naming ``view``'s operation, not signed with the provider's secret."""
    signed = evidence_for(view, reference=f"forged_{n}")
    return {**signed, "signature": f"{n:064x}"}


def _settling(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        o
        for o in view["observations"]
        if o["revision_after"] == view["revision"]
        and (o["revision_before"] or 0) < o["revision_after"]
        and o["disposition"] in ("applied", "strengthened", "conflict")
    ]


def test_an_observer_cannot_write_into_another_tenants_history(
    base_url: str, app_database: str
) -> None:
    b_client = new_principal(base_url, tenant=_tenant())
    victim = _paid(base_url, b_client["api_key"])
    assert victim["state"] == "completed"
    assert len(_settling(victim)) == 1
    b_admin = new_principal(base_url, tenant=victim["tenant"], role="admin")
    a_observer = new_principal(base_url, tenant=_tenant(), role="observer")

    # evidence the provider did sign (seen on a feed that spans tenants): not A's to give
    genuine = observe(base_url, a_observer["api_key"], evidence_for(victim, reference="p_b"))
    assert genuine.status_code == 404, genuine.text
    # as the review did it: forged documents naming B's payout, up to A's limit and past it
    for n in range(QUARANTINE_LIMIT - 1):
        refused = observe(base_url, a_observer["api_key"], _forged(victim, n))
        assert refused.status_code == 422, refused.text
    assert observe(base_url, a_observer["api_key"], _forged(victim, 0)).status_code == 429

    for key in (b_client["api_key"], b_admin["api_key"]):
        after = status(base_url, key, victim["id"])
        assert after == victim  # nothing was added to B's history
        assert (
            a_observer["id"]
            not in httpx.get(f"{base_url}/v1/operations/{victim['id']}", headers=auth(key)).text
        )
        assert _settling(after) == _settling(victim)
    with signed_in_client(base_url, b_admin["api_key"]) as console:
        page = console.get(f"/console/operations/{victim['id']}")
        assert page.status_code == 200, page.text
        assert a_observer["id"] not in page.text
        assert "unverified" not in page.text and "forged" not in page.text

    # what A sent is kept with A, under no operation
    assert (
        scalar(
            app_database,
            "SELECT count(*) FROM observations WHERE operation_id IS NULL"
            " AND reason = 'unknown-operation' AND detail ->> 'principal_id' = :a",
            a=a_observer["id"],
        )
        == QUARANTINE_LIMIT
    )
    assert (
        scalar(
            app_database,
            "SELECT count(*) FROM observations WHERE detail ->> 'principal_id' = :a"
            " AND operation_id IS NOT NULL",
            a=a_observer["id"],
        )
        == 0
    )


def test_another_tenants_operation_is_answered_as_one_that_does_not_exist(
    base_url: str,
) -> None:
    b_client = new_principal(base_url, tenant=_tenant())
    victim = _paid(base_url, b_client["api_key"])
    ghost = {**victim, "id": str(uuid.uuid4())}
    a_observer = new_principal(base_url, tenant=_tenant(), role="observer")["api_key"]

    def answer(signed: dict[str, Any]) -> tuple[int, str, str]:
        got = observe(base_url, a_observer, signed)
        body = got.json()
        return (
            got.status_code,
            body["type"],
            body["detail"].replace(signed["evidence"]["operation_id"], "X"),
        )

    assert answer(_forged(victim, 1)) == answer(_forged(ghost, 1))
    assert answer(evidence_for(victim, reference="r")) == answer(evidence_for(ghost, reference="r"))


def test_an_observer_past_its_quarantine_limit_gets_429_and_records_nothing(
    base_url: str, app_database: str
) -> None:
    tenant = _tenant()
    observer = new_principal(base_url, tenant=tenant, role="observer")
    other = new_principal(base_url, tenant=tenant, role="observer")
    ghost = {"id": str(uuid.uuid4()), "binding_generation": 1, "request_fingerprint": "f" * 64}
    for n in range(QUARANTINE_LIMIT):
        assert observe(base_url, observer["api_key"], _forged(ghost, n)).status_code == 422

    kept = "SELECT count(*) FROM observations WHERE detail ->> 'principal_id' = :p"
    assert scalar(app_database, kept, p=observer["id"]) == QUARANTINE_LIMIT
    for signed in (_forged(ghost, 999), evidence_for(ghost, reference="signed")):
        refused = observe(base_url, observer["api_key"], signed)
        assert refused.status_code == 429, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["type"] == "/problems/evidence-quota-exceeded"
        assert QUARANTINE_WINDOW - 120 < int(refused.headers["retry-after"]) <= QUARANTINE_WINDOW
    assert scalar(app_database, kept, p=observer["id"]) == QUARANTINE_LIMIT

    # the cap is the observer's own: another observer of the tenant is still heard
    assert observe(base_url, other["api_key"], _forged(ghost, 1)).status_code == 422
    page = httpx.get(
        f"{base_url}/problems/evidence-quota-exceeded", headers={"Accept": "application/json"}
    )
    assert page.status_code == 200 and page.json()["status"] == 429


def test_the_status_view_pages_newest_first_and_always_shows_the_settling_observation(
    base_url: str, app_database: str
) -> None:
    tenant = _tenant()
    client_key = new_principal(base_url, tenant=tenant)["api_key"]
    observer_key = new_principal(base_url, tenant=tenant, role="observer")["api_key"]
    view = _paid(base_url, client_key)
    settling = _settling(view)
    assert len(settling) == 1
    # the tenant's own observer: unsigned evidence is listed (capped), replays are ignored
    unsigned = observe(base_url, observer_key, _forged(view, 7))
    assert unsigned.status_code == 422
    signed = evidence_for(view, reference=view["result"]["body"]["provider_reference"])
    for _ in range(PAGE + 5):
        assert observe(base_url, observer_key, signed).status_code == 202

    every = [
        int(i)
        for i in scalar(
            app_database,
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM observations"
            " WHERE operation_id = :op",
            op=uuid.UUID(view["id"]),
        ).split(",")
    ]
    assert len(every) == len(view["observations"]) + 1 + PAGE + 5

    newest = status(base_url, client_key, view["id"])
    ids = [o["id"] for o in newest["observations"]]
    assert ids == sorted(ids)
    assert ids[-PAGE:] == every[-PAGE:]  # the newest page, oldest first
    assert settling[0] in newest["observations"]  # however far back it is
    assert len(ids) == PAGE + 1
    assert newest["older_observations"] == every[-PAGE]
    assert {k: v for k, v in newest.items() if k not in ("observations", "older_observations")} == {
        k: v for k, v in view.items() if k not in ("observations", "older_observations")
    }

    older = httpx.get(
        f"{base_url}/v1/operations/{view['id']}",
        params={"observations_before": newest["older_observations"]},
        headers=auth(client_key),
    ).json()
    assert older["older_observations"] is None
    assert [o["id"] for o in older["observations"]] == every[:-PAGE]
    assert settling[0] in older["observations"]
    assert any(o["reason"] == "unverified-evidence" for o in older["observations"])

    by_key = httpx.get(
        f"{base_url}/v1/operations",
        params={"key": view["key"], "observations_before": newest["older_observations"]},
        headers=auth(client_key),
    ).json()
    assert by_key["observations"] == older["observations"]

    # the console lists the same page, with a link to the older one
    admin = new_principal(base_url, tenant=tenant, role="admin")["api_key"]
    with signed_in_client(base_url, admin) as console:
        page = console.get(f"/console/operations/{view['id']}")
        assert f"observations_before={newest['older_observations']}" in page.text
        page = console.get(
            f"/console/operations/{view['id']}",
            params={"observations_before": str(newest["older_observations"])},
        )
        assert page.status_code == 200 and 'id="newest-observations"' in page.text
        assert (
            console.get(
                f"/console/operations/{view['id']}", params={"observations_before": "²"}
            ).status_code
            == 400
        )


@pytest.mark.parametrize("before", ["0", "-1", "x", str(2**63), "1.5"])
def test_a_bad_observations_cursor_is_a_400_problem(base_url: str, before: str) -> None:
    client_key = new_principal(base_url, tenant=_tenant())["api_key"]
    view = _paid(base_url, client_key)
    for url, params in (
        (f"{base_url}/v1/operations/{view['id']}", {"observations_before": before}),
        (f"{base_url}/v1/operations", {"key": view["key"], "observations_before": before}),
    ):
        answer = httpx.get(url, params=params, headers=auth(client_key))
        assert answer.status_code == 400, answer.text
        assert answer.json()["type"] == "/problems/validation-error"
    misspelt = httpx.get(
        f"{base_url}/v1/operations/{view['id']}",
        params={"observation_before": "5"},
        headers=auth(client_key),
    )
    assert misspelt.status_code == 400
