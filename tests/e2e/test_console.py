"""The operator console over plain HTTP: its sessions (cookie attributes, no fixation, a
rotated or revoked key ends them at once, expiry), form tokens, redirects after sign-in,
framing, and tenant isolation. The browser walk-through is tests/e2e/test_console_browser.py."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.e2e.client import (
    ADMIN_KEY,
    auth,
    count_rows,
    execute,
    new_principal,
    scalar,
)
from tests.e2e.console import SECURITY_HEADERS, form_token, sign_in, signed_in_client
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def assert_guarded(answer: httpx.Response) -> None:
    """The console's security headers: no framing, no referrer, nothing cached."""
    csp = answer.headers.get("content-security-policy", "")
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp, answer.headers
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers.get(name) == value, (name, answer.headers)


def operation_of(base: str, tenant: str) -> str:
    """An operation (an account's opening) in ``tenant``."""
    key = new_principal(base, tenant=tenant)["api_key"]
    opened = httpx.post(
        f"{base}/v1/accounts",
        json={"currency": "EUR", "opening_balance": 5},
        headers={**auth(key), "Idempotency-Key": uuid.uuid4().hex},
    )
    assert opened.status_code == 201, opened.text
    return opened.headers["operation-id"]


def test_every_console_answer_forbids_framing_and_caching(server: ServerProcess) -> None:
    """Clickjacking: frame-ancestors 'none' and X-Frame-Options DENY on pages, redirects,
    refusals and 404s alike."""
    base = server.base_url
    with httpx.Client(base_url=base, timeout=30) as anonymous:
        for path in ("/console/sign-in", "/console", "/console/feeds", "/console/nope"):
            assert_guarded(anonymous.get(path))
        assert_guarded(anonymous.post("/console/sign-out", data={"csrf": "x"}))
    with signed_in_client(base, ADMIN_KEY) as client:
        for path in ("/console", "/console/feeds", "/console/principals", "/console?state=x"):
            answer = client.get(path)
            assert answer.status_code in (200, 400), answer.text
            assert answer.headers["content-type"].startswith("text/html")
            assert_guarded(answer)
    # the API keeps its own answers: no console header leaks onto them
    assert "x-frame-options" not in httpx.get(f"{base}/health").headers


def test_the_session_cookie_is_strict_http_only_and_secure_over_https(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    admin = new_principal(base, tenant="cookies", role="admin")["api_key"]
    with httpx.Client(base_url=base, timeout=30) as client:
        answer = sign_in(client, admin)
        assert answer.status_code == 303 and answer.headers["location"] == "/console"
        cookie = next(
            c for c in answer.headers.get_list("set-cookie") if c.startswith("console_session=")
        )
        attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
        assert {"httponly", "max-age", "path"} <= attributes, cookie
        assert "samesite=strict" in cookie.lower() and "path=/console" in cookie.lower()
        assert "secure" not in attributes  # plain http: a Secure cookie would never come back
        session_id = cookie.split(";")[0].split("=", 1)[1]
        # only the SHA-256 of the id is stored
        stored = scalar(
            app_database,
            "SELECT count(*) FROM console_sessions WHERE id_hash = sha256(convert_to(:s, 'UTF8'))",
            s=session_id,
        )
        assert stored == 1
        pages = [client.get(p).text for p in ("/console", "/console/principals")]
        assert all(admin not in page for page in pages)
    with httpx.Client(base_url=base, timeout=30) as tls:
        # behind a TLS-terminating proxy on the same host (uvicorn trusts 127.0.0.1's
        # X-Forwarded-Proto); httpx keeps Secure cookies to https, so this one is sent by hand
        form = tls.get("/console/sign-in", headers={"X-Forwarded-Proto": "https"})
        assert "secure" in form.headers["set-cookie"].lower()
        answer = tls.post(
            "/console/sign-in",
            data={"csrf": form_token(form.text), "api_key": admin},
            headers={
                "X-Forwarded-Proto": "https",
                "Cookie": f"console_sign_in={form.cookies['console_sign_in']}",
            },
        )
        assert answer.status_code == 303, answer.text
        assert "secure" in answer.headers["set-cookie"].lower()
    assert admin not in server.output()  # never logged


def test_a_sign_in_never_adopts_a_session_id_it_did_not_make(server: ServerProcess) -> None:
    """Session fixation: a planted cookie is not taken up, and a second sign-in gets a new
    id while the first one stops working."""
    base = server.base_url
    with httpx.Client(base_url=base, timeout=30) as client:
        client.cookies.set("console_session", "planted-by-someone-else", path="/console")
        first = sign_in(client, ADMIN_KEY)
        assert first.status_code == 303
        first_id = first.cookies["console_session"]
        assert first_id != "planted-by-someone-else"
        second = sign_in(client, ADMIN_KEY)
        assert second.status_code == 303, second.text
        second_id = second.cookies["console_session"]
        assert second_id not in (first_id, "planted-by-someone-else")
        assert client.get("/console").status_code == 200
    with httpx.Client(base_url=base, timeout=30, cookies={"console_session": first_id}) as old:
        gone = old.get("/console")
        assert gone.status_code == 303 and gone.headers["location"].startswith("/console/sign-in")


def test_a_form_without_its_token_is_refused_and_changes_nothing(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    operation = operation_of(base, "forms")
    with signed_in_client(base, ADMIN_KEY) as client:
        token = form_token(client.get("/console").text)
        before = count_rows(app_database)
        forged = [
            (
                f"/console/operations/{operation}/supersede",
                {"reason": "x", "force": "on", "confirm": operation},
            ),
            ("/console/principals", {"tenant": "forms", "name": "mallory", "role": "admin"}),
            ("/console/feeds/payments/holds", {"event_id": "e", "action": "quarantine"}),
            ("/console/sign-out", {}),
        ]
        for path, data in forged:
            for csrf in (None, "", token[:-1] + ("A" if token[-1] != "A" else "B")):
                sent = data if csrf is None else {**data, "csrf": csrf}
                refused = client.post(path, data=sent)
                assert refused.status_code == 403, (path, refused.text)
                assert "Form refused" in refused.text
            as_json = client.post(path, json={**data, "csrf": token})
            assert as_json.status_code == 403, as_json.text
        assert count_rows(app_database) == before
        assert client.get("/console").status_code == 200  # still signed in
    # the sign-in form is guarded too: a post without the form's own token opens nothing
    with httpx.Client(base_url=base, timeout=30) as client:
        refused = client.post("/console/sign-in", data={"api_key": ADMIN_KEY})
        assert refused.status_code == 403 and "console_session" not in refused.cookies
        assert ADMIN_KEY not in refused.text
    assert count_rows(app_database) == before


@pytest.mark.parametrize(
    "next_path",
    [
        "https://evil.example/",
        "//evil.example/console",
        "/\\evil.example",
        "\\\\evil.example",
        "/console/../admin/v1/operations",
        "/console//evil.example",
        "/admin/v1/operations",
        "javascript:alert(1)",
        "/consoleevil",
        "/console\r\nLocation: https://evil.example",
        "http:/console",
        # percent-encoded dot segments, which the browser decodes (out of /console)
        "/console/%2e%2e/metrics",
        "/console/%2E%2E/admin/v1/operations",
        "/console/.%2e/metrics",
        "/console/%2e./metrics",
        "/console/%2e%2e%2fmetrics",
        "/console/%252e%252e/metrics",
        "/console/%5c..%5cmetrics",
    ],
)
def test_sign_in_never_redirects_outside_the_console(server: ServerProcess, next_path: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        answer = sign_in(client, ADMIN_KEY, next_path)
        assert answer.status_code == 303
        assert answer.headers["location"] == "/console"


def test_sign_in_goes_back_to_the_console_page_asked_for(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        asked = client.get("/console/feeds?x=1")
        assert asked.status_code == 303
        assert asked.headers["location"] == "/console/sign-in?next=%2Fconsole%2Ffeeds%3Fx%3D1"
        back = sign_in(client, ADMIN_KEY, "/console/feeds?x=1")
        assert back.headers["location"] == "/console/feeds?x=1"


@pytest.mark.parametrize("action", ["rotate", "revoke"])
def test_a_rotated_or_revoked_key_ends_its_sessions_at_once(
    server: ServerProcess, action: str
) -> None:
    base = server.base_url
    admin = new_principal(base, tenant="rotation", role="admin")
    with signed_in_client(base, admin["api_key"]) as client:
        assert client.get("/console").status_code == 200
        done = httpx.post(
            f"{base}/admin/v1/principals/{admin['id']}/{action}", headers=auth(ADMIN_KEY)
        )
        assert done.status_code == 200, done.text
        ended = client.get("/console")
        assert ended.status_code == 303, ended.text
        assert ended.headers["location"].startswith("/console/sign-in")


def test_an_expired_session_ends(server: ServerProcess, app_database: str) -> None:
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        assert client.get("/console").status_code == 200
        session_id = client.cookies["console_session"]
        execute(
            app_database,
            "UPDATE console_sessions SET expires_at = now() - interval '1 second' "
            "WHERE id_hash = sha256(convert_to(:s, 'UTF8'))",
            s=session_id,
        )
        assert client.get("/console").status_code == 303


def test_sign_out_ends_the_session(server: ServerProcess) -> None:
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        session_id = client.cookies["console_session"]
        token = form_token(client.get("/console").text)
        out = client.post("/console/sign-out", data={"csrf": token})
        assert out.status_code == 303 and out.headers["location"] == "/console/sign-in"
    with httpx.Client(
        base_url=server.base_url, timeout=30, cookies={"console_session": session_id}
    ) as replayed:
        assert replayed.get("/console").status_code == 303


def test_a_tenant_admin_sees_only_its_tenant(server: ServerProcess) -> None:
    base = server.base_url
    theirs = operation_of(base, "tenant-b")
    ours = operation_of(base, "tenant-a")
    admin = new_principal(base, tenant="tenant-a", role="admin")["api_key"]
    with signed_in_client(base, admin) as client:
        assert client.get(f"/console/operations/{ours}").status_code == 200
        hidden = client.get(f"/console/operations/{theirs}")
        assert hidden.status_code == 404 and "tenant-b" not in hidden.text
        assert client.get("/console?tenant=tenant-b").status_code == 403
        assert client.get("/console/feeds").status_code == 403
        listed = client.get("/console/principals").text
        assert "tenant-b" not in listed
    with signed_in_client(base, ADMIN_KEY) as client:
        page = client.get(f"/console/operations/{theirs}")
        assert page.status_code == 200 and "tenant-b" in page.text


def test_a_client_or_observer_key_cannot_sign_in(server: ServerProcess, app_database: str) -> None:
    base = server.base_url
    before = scalar(app_database, "SELECT count(*) FROM console_sessions")
    for role in ("client", "observer"):
        key = new_principal(base, role=role)["api_key"]
        with httpx.Client(base_url=base, timeout=30) as client:
            refused = sign_in(client, key)
            assert refused.status_code == 401 and key not in refused.text
    assert scalar(app_database, "SELECT count(*) FROM console_sessions") == before


def test_force_needs_the_typed_operation_id_and_the_answer_shows_the_new_epoch(
    server: ServerProcess,
) -> None:
    """A completed operation: the page says the effect may run again, force is refused
    until the operation id is typed, then the new epoch is shown."""
    base = server.base_url
    operation = operation_of(base, "local")
    with signed_in_client(base, ADMIN_KEY) as client:
        page = client.get(f"/console/operations/{operation}")
        assert "Operation created" in page.text and "fencing token 1" in page.text
        assert "The effect may run again." in page.text
        token = form_token(page.text)
        refused = client.post(
            f"/console/operations/{operation}/supersede",
            data={"csrf": token, "reason": "try", "force": "on", "confirm": "wrong"},
        )
        assert refused.status_code == 409 and "Force was not confirmed" in refused.text
        done = client.post(
            f"/console/operations/{operation}/supersede",
            data={"csrf": token, "reason": "operator test", "force": "on", "confirm": operation},
        )
        assert done.status_code == 200, done.text
        assert 'id="new-epoch">2<' in done.text


@pytest.mark.parametrize(
    "older",
    ["\u00b2", "\uff11\uff12", "\u0661", "9" * 5000, "1" * 7, "525601", "-1", "+5", " 5", "5 ",
     "1e3", "0x10", "1.5", "\x00"],
)  # fmt: skip
def test_the_work_list_refuses_an_age_that_is_not_a_few_ascii_digits(
    server: ServerProcess, older: str
) -> None:
    """Superscripts, other scripts' digits and numbers too long to convert are a 400 page,
    never a 500."""
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        refused = client.get("/console", params={"older": older})
        assert refused.status_code == 400, refused.text
        assert "whole number of minutes" in refused.text
        assert_guarded(refused)
        for fine in ("0", "10", "525600"):
            assert client.get("/console", params={"older": fine}).status_code == 200
