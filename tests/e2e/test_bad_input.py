"""Bad input gets the documented problem and writes nothing (row counts of every table)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.e2e.client import auth, count_rows, new_account, new_principal
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def caller(server: ServerProcess) -> dict[str, str]:
    key = new_principal(server.base_url)["api_key"]
    return {
        "key": key,
        "source": new_account(server.base_url, key, 100),
        "destination": new_account(server.base_url, key, 0),
    }


def _body(caller: dict[str, str], **changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "source": caller["source"],
        "destination": caller["destination"],
        "amount": 10,
        "currency": "EUR",
    }
    body.update(changes)
    return {k: v for k, v in body.items() if v is not ...}


CASES = {
    "missing-key": (None, None, 400, "idempotency-key-missing"),
    "empty-key": ("", None, 400, "idempotency-key-invalid"),
    "empty-quoted-key": ('""', None, 400, "idempotency-key-invalid"),
    "oversized-key": ("k" * 256, None, 400, "idempotency-key-invalid"),
    "non-ascii-key": ("kl\u00e9".encode(), None, 400, "idempotency-key-invalid"),
    "control-char-key": ("a\tb", None, 400, "idempotency-key-invalid"),
    "unterminated-quote": ('"abc', None, 400, "idempotency-key-invalid"),
    "bad-escape": ('"a\\nb"', None, 400, "idempotency-key-invalid"),
    "malformed-json": ("k1", b"{not json", 400, "validation-error"),
    "json-array": ("k2", b"[]", 400, "validation-error"),
    "empty-body": ("k3", b"", 400, "validation-error"),
    "amount-as-string": ("k4", {"amount": "10"}, 400, "validation-error"),
    "amount-float": ("k5", {"amount": 10.5}, 400, "validation-error"),
    "zero-amount": ("k6", {"amount": 0}, 400, "validation-error"),
    "negative-amount": ("k7", {"amount": -5}, 400, "validation-error"),
    "huge-amount": ("k8", {"amount": 10**20}, 400, "validation-error"),
    "unknown-currency": ("k9", {"currency": "XYZ"}, 400, "validation-error"),
    "lowercase-currency": ("k10", {"currency": "eur"}, 400, "validation-error"),
    "missing-field": ("k11", {"amount": ...}, 400, "validation-error"),
    "unknown-field": ("k12", {"color": "red"}, 400, "validation-error"),
    "not-a-uuid": ("k13", {"source": "acct-1"}, 400, "validation-error"),
    "same-accounts": ("k14", "same", 400, "validation-error"),
    "long-memo": ("k15", {"memo": "m" * 513}, 400, "validation-error"),
    "huge-body": ("k16", b"{" + b" " * (1024 * 1024 + 10) + b"}", 413, "payload-too-large"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_transfer_input_is_refused_and_writes_nothing(
    server: ServerProcess, app_database: str, caller: dict[str, str], case: str
) -> None:
    key, body, status, slug = CASES[case]
    headers: dict[str, str | bytes] = {**auth(caller["key"]), "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    if body is None:
        content = httpx.Request("POST", "/", json=_body(caller)).content
    elif body == "same":
        content = httpx.Request(
            "POST", "/", json=_body(caller, destination=caller["source"])
        ).content
    elif isinstance(body, dict):
        content = httpx.Request("POST", "/", json=_body(caller, **body)).content
    else:
        content = body
    before = count_rows(app_database)

    response = httpx.post(f"{server.base_url}/v1/transfers", content=content, headers=headers)

    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == f"/problems/{slug}"
    assert problem["status"] == status
    assert problem["title"] and problem["detail"]
    assert response.headers["idempotent-replayed"] == "false"
    assert count_rows(app_database) == before


@pytest.mark.parametrize(
    ("authorization", "status", "slug"),
    [
        (None, 401, "unauthenticated"),
        ("Bearer", 401, "unauthenticated"),
        ("Basic dXNlcjpwYXNz", 401, "unauthenticated"),
        ("Bearer sk_not-a-real-key", 401, "unauthenticated"),
        ("Bearer " + "x" * 600, 401, "unauthenticated"),
    ],
    ids=["missing", "empty-bearer", "basic", "unknown-key", "oversized"],
)
def test_bad_credentials_are_refused_and_write_nothing(
    server: ServerProcess, app_database: str, authorization: str | None, status: int, slug: str
) -> None:
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    if authorization is not None:
        headers["Authorization"] = authorization
    before = count_rows(app_database)
    response = httpx.post(f"{server.base_url}/v1/transfers", json={"amount": 1}, headers=headers)
    assert response.status_code == status
    assert response.json()["type"] == f"/problems/{slug}"
    assert count_rows(app_database) == before


def test_observer_may_not_transfer(server: ServerProcess, app_database: str) -> None:
    observer = new_principal(server.base_url, role="observer")["api_key"]
    before = count_rows(app_database)
    response = httpx.post(
        f"{server.base_url}/v1/transfers",
        json={"amount": 1},
        headers={**auth(observer), "Idempotency-Key": "x"},
    )
    assert response.status_code == 403
    assert response.json()["type"] == "/problems/forbidden"
    assert count_rows(app_database) == before


def test_client_may_not_create_principals(server: ServerProcess, app_database: str) -> None:
    client = new_principal(server.base_url)["api_key"]
    before = count_rows(app_database)
    response = httpx.post(
        f"{server.base_url}/admin/v1/principals",
        json={"tenant": "acme", "name": "x", "role": "admin"},
        headers=auth(client),
    )
    assert response.status_code == 403
    assert count_rows(app_database) == before


@pytest.mark.parametrize(
    "path", ["/v1/nope", "/v1/accounts/not-a-uuid", "/v1/operations/123", "/admin/v1/x"]
)
def test_unknown_routes_are_404_problems(server: ServerProcess, path: str) -> None:
    response = httpx.get(f"{server.base_url}{path}", headers=auth("whatever"))
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_payouts_off_still_asks_for_credentials_first(server: ServerProcess) -> None:
    """A server without a provider says "no payouts here" only to a well-formed request of a
    caller who may pay out (found by the schema fuzz run: it answered 404 without a key)."""
    body = {"beneficiary": "ACME", "amount": 1, "currency": "EUR"}
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    anonymous = httpx.post(f"{server.base_url}/v1/payouts", json=body, headers=headers)
    observer = new_principal(server.base_url, role="observer")["api_key"]
    wrong_role = httpx.post(
        f"{server.base_url}/v1/payouts", json=body, headers={**headers, **auth(observer)}
    )
    client = new_principal(server.base_url)["api_key"]
    off = httpx.post(
        f"{server.base_url}/v1/payouts", json=body, headers={**headers, **auth(client)}
    )
    no_key = httpx.post(f"{server.base_url}/v1/payouts", json=body, headers=auth(client))
    assert (anonymous.status_code, anonymous.json()["type"]) == (401, "/problems/unauthenticated")
    assert (wrong_role.status_code, wrong_role.json()["type"]) == (403, "/problems/forbidden")
    assert (no_key.status_code, no_key.json()["type"]) == (400, "/problems/idempotency-key-missing")
    assert (off.status_code, off.json()["type"]) == (404, "/problems/not-found")
    assert off.headers["idempotent-replayed"] == "false"
