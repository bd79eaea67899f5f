"""Hostile input the earlier suites did not send: each is a 4xx problem document that changes
nothing (and a 401 names its scheme)."""

from __future__ import annotations

import base64
import contextlib
import re
import socket

import httpx
import pytest

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


def _raw(server: ServerProcess, request: bytes) -> bytes:
    """``request`` as bytes on a fresh connection; everything the server sends until it
    closes the connection (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(request)
        received = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                received += chunk
    return received


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHo st: x\r\n\r\n",
        # a bare CR inside a header stays a framing error (no smuggling through it)
        b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nX: a\rContent-Length: 5\r\n\r\n",
    ],
    ids=["not-http", "bad-version", "space-in-name", "bare-cr"],
)
def test_a_request_that_is_not_http_is_the_servers_400_and_the_server_goes_on(
    server: ServerProcess, app_database: str, request_bytes: bytes
) -> None:
    """The server's parser refuses it with its own 400 before the app runs."""
    before = count_rows(app_database)
    answer = _raw(server, request_bytes)
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert count_rows(app_database) == before
    assert httpx.get(f"{server.base_url}/health").status_code == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        # RFC 9112 2.2: a recipient may take a bare LF for a line's end, as the parser does
        b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nX: a\nContent-Length: 5\r\n\r\n",
        # RFC 9112 6.3: Transfer-Encoding wins, and the connection closes after the answer
        b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["bare-lf", "cl-and-te"],
)
def test_an_ambiguous_frame_gets_one_answer_and_nothing_smuggled_behind_it(
    server: ServerProcess, app_database: str, request_bytes: bytes
) -> None:
    """A request framed two ways is read one way (the RFC's) and refused: a request
    pipelined behind it is never served as one (it is the first request's body, or the
    connection closes before it), nothing is stored."""
    before = count_rows(app_database)
    smuggled = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _raw(server, request_bytes + smuggled)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses, answer
    assert all(status.startswith(b"4") for status in statuses), answer
    assert b'{"status":"ok"}' not in answer, answer
    assert count_rows(app_database) == before
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_control_characters_in_header_values_are_refused_and_change_nothing(
    server: ServerProcess, app_database: str
) -> None:
    """A key with a control character is refused: by the server's parser (its own 400,
    before the app runs) or, for what the parser lets through (a byte over 0x7F), by the
    app's ``idempotency-key-invalid``. Nothing is stored either way, and the server goes on."""
    client = new_principal(server.base_url)["api_key"]
    before = count_rows(app_database)
    body = b'{"currency":"EUR"}'
    for key in (b"a\x1fb", b"kl\xe9", b"a\x7f", b"a\x00b"):
        raw = _raw(
            server,
            b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Authorization: Bearer {client}\r\n".encode()
            + b"Content-Type: application/json\r\nIdempotency-Key: "
            + key
            + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body,
        )
        assert raw.startswith(b"HTTP/1.1 400 "), raw
        if b"application/problem+json" in raw:
            assert b"/problems/idempotency-key-invalid" in raw, raw
    assert count_rows(app_database) == before
    answer = httpx.get(f"{server.base_url}/health", headers=[("X-Odd", b"\x01\x1f\xff")])
    assert answer.status_code == 400
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_pipelined_requests_get_whole_answers_in_order(server: ServerProcess) -> None:
    """Pipelined requests, one without a body in its answer (HEAD) and one unknown path, get
    every answer whole and in order."""
    answer = _raw(
        server,
        b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    # HEAD is not a method of /livez: 405, whose body a HEAD answer leaves out
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"200", b"405", b"404", b"200"], answer
    assert answer.count(b'{"status":"ok"}') == 2, answer
    assert answer.count(b"/problems/not-found") == 1, answer
    assert b"/problems/method-not-allowed" not in answer, answer


def test_an_answer_without_a_body_leaves_at_once(server: ServerProcess) -> None:
    """A HEAD answer (no body) leaves when the answer is complete, not when the connection
    closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
        sock.sendall(b"HEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: no close
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 405 "), head
    assert head.endswith(b"\r\n\r\n"), head
