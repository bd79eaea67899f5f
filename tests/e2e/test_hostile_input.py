"""Hostile input the earlier suites did not send: each is a 4xx problem document that changes
nothing (and a 401 names its scheme)."""

from __future__ import annotations

import base64

import httpx

from tests.e2e.client import ADMIN_KEY, auth, count_rows, new_principal
from tests.e2e.server import ServerProcess

PROBLEM = "application/problem+json"
# 2 KB of nesting: deeper than msgspec recurses
DEEP = b"[" * 1000 + b"]" * 1000


def problem_of(response: httpx.Response, status: int, slug: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["type"] == f"/problems/{slug}"


def test_a_401_names_the_bearer_scheme(server: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
        answer = httpx.get(f"{server.base_url}/v1/operations?key=k", headers=headers)
        problem_of(answer, 401, "unauthenticated")
        assert answer.headers["www-authenticate"].startswith("Bearer")


def test_json_nested_too_deeply_is_a_400_everywhere(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    client = new_principal(base)["api_key"]
    observer = new_principal(base, role="observer")["api_key"]
    before = count_rows(app_database)
    sends = [
        (f"{base}/v1/observations", auth(observer), DEEP),
        (f"{base}/v1/observations", auth(observer), b'{"evidence":' + DEEP + b"}"),
        (f"{base}/admin/v1/principals", auth(ADMIN_KEY), DEEP),
        (
            f"{base}/admin/v1/operations/00000000-0000-4000-8000-000000000001/supersede",
            auth(ADMIN_KEY),
            b'{"reason":"x","request":' + DEEP + b"}",
        ),
        (f"{base}/v1/transfers", {**auth(client), "Idempotency-Key": "deep"}, DEEP),
        (f"{base}/v1/accounts", {**auth(client), "Idempotency-Key": "deep"}, DEEP),
    ]
    for url, headers, body in sends:
        headers = {**headers, "Content-Type": "application/json"}
        answer = httpx.post(url, content=body, headers=headers, timeout=30)
        assert answer.status_code in (400, 404), (url, answer.status_code, answer.text)
        assert answer.headers["content-type"] == PROBLEM
    assert count_rows(app_database) == before


def test_a_signature_that_is_not_lower_case_hex_is_a_400(
    server: ServerProcess, app_database: str
) -> None:
    observer = new_principal(server.base_url, role="observer")["api_key"]
    evidence = {
        "operation_id": "00000000-0000-4000-8000-000000000001",
        "binding_generation": 1,
        "request_fingerprint": "0" * 64,
        "outcome": "completed",
        "result": {"status": 201, "body": {}},
        "result_digest": "0" * 64,
        "issued_at": "2026-12-03T00:00:00Z",
    }
    before = count_rows(app_database)
    for signature in ("\u00e9" * 64, "A" * 64, "0" * 63, "0" * 64 + "\n", "\u0660" * 64):
        answer = httpx.post(
            f"{server.base_url}/v1/observations",
            json={"evidence": evidence, "signature": signature},
            headers=auth(observer),
        )
        problem_of(answer, 400, "validation-error")
    assert count_rows(app_database) == before


def test_work_list_parameters_postgresql_cannot_hold_are_a_400(server: ServerProcess) -> None:
    def cursor(created: str) -> str:
        raw = f"{created}|00000000-0000-4000-8000-000000000001".encode()
        return base64.urlsafe_b64encode(raw).decode()

    bad = [
        {"tenant": "\x00"},
        {"tenant": "acme\n"},
        {"tenant": "x" * 129},
        {"after": cursor("9999-12-31T23:59:59.999999+00:00")},
        {"after": cursor("0001-01-01T00:00:00-23:59")},
        {"after": cursor("2026-12-03T00:00:00")},  # no offset
        {"after": cursor("2026-12-03T00:00:00+99:00")},
        {"after": "%%%"},
    ]
    for params in bad:
        answer = httpx.get(
            f"{server.base_url}/admin/v1/operations",
            params={"state": "unknown", **params},
            headers=auth(ADMIN_KEY),
        )
        problem_of(answer, 400, "validation-error")
    # a good cursor with an odd but valid offset pages on
    fine = httpx.get(
        f"{server.base_url}/admin/v1/operations",
        params={"state": "unknown", "after": cursor("2026-12-03T00:00:00+05:45")},
        headers=auth(ADMIN_KEY),
    )
    assert fine.status_code == 200, fine.text


def test_a_body_that_is_not_json_is_a_415_on_every_route_and_writes_nothing(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    client = new_principal(base)["api_key"]
    observer = new_principal(base, role="observer")["api_key"]
    keyed = {**auth(client), "Idempotency-Key": "not-json"}
    sends = [
        (f"{base}/v1/accounts", keyed, b'{"currency":"EUR"}'),
        (f"{base}/v1/transfers", keyed, b"{}"),
        (f"{base}/v1/observations", auth(observer), b"{}"),
        (f"{base}/admin/v1/principals", auth(ADMIN_KEY), b'{"tenant":"t","name":"n"}'),
        (
            f"{base}/admin/v1/operations/00000000-0000-4000-8000-000000000001/supersede",
            auth(ADMIN_KEY),
            b'{"reason":"x"}',
        ),
    ]
    before = count_rows(app_database)
    for content_type in (
        None,
        "application/x-www-form-urlencoded",
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ):
        for url, headers, body in sends:
            sent = headers if content_type is None else {**headers, "Content-Type": content_type}
            answer = httpx.post(url, content=body, headers=sent)
            problem_of(answer, 415, "unsupported-media-type")
    assert count_rows(app_database) == before
    # what JSON may be called: any case, a UTF-8 charset, a +json suffix
    for content_type in (
        "APPLICATION/JSON",
        "application/json; charset=UTF-8",
        "application/merge-patch+json",
    ):
        answer = httpx.post(
            f"{base}/v1/accounts",
            content=b'{"currency":"EUR"}',
            headers={**auth(client), "Idempotency-Key": content_type, "Content-Type": content_type},
        )
        assert answer.status_code == 201, answer.text


def test_payouts_without_a_provider_are_a_404_not_an_outage(server: ServerProcess) -> None:
    client = new_principal(server.base_url)["api_key"]
    answer = httpx.post(
        f"{server.base_url}/v1/payouts",
        json={"beneficiary": "ACME", "amount": 1, "currency": "EUR"},
        headers={**auth(client), "Idempotency-Key": "no-provider"},
    )
    problem_of(answer, 404, "not-found")
