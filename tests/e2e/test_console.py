"""The operator console over plain HTTP: its sessions (cookie attributes, no fixation, a
rotated or revoked key ends them at once, expiry), form tokens, redirects after sign-in,
framing, and tenant isolation. The browser walk-through is tests/e2e/test_console_browser.py."""

from __future__ import annotations

import re
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
    until,
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


def _opened(base: str, key: str, idempotency_key: str) -> str:
    """An account opened by ``key``'s principal under ``idempotency_key``: its operation."""
    opened = httpx.post(
        f"{base}/v1/accounts",
        json={"currency": "EUR", "opening_balance": 5},
        headers={**auth(key), "Idempotency-Key": idempotency_key},
    )
    assert opened.status_code == 201, opened.text
    return opened.headers["operation-id"]


def test_the_work_list_finds_operations_by_key_or_id_in_the_admins_reach(
    server: ServerProcess,
) -> None:
    """One key, used by two principals of one tenant and one of another: an all-tenant admin
    finds all three (completed too), or one tenant's with the tenant filter; a tenant admin
    only its own. An operation id goes to its page, if the admin may see it; otherwise the
    usual not-found page, which says nothing of the other tenant."""
    base = server.base_url
    key = "order-" + uuid.uuid4().hex[:8]
    ours = [_opened(base, new_principal(base, tenant="search-a")["api_key"], key) for _ in "12"]
    theirs = _opened(base, new_principal(base, tenant="search-b")["api_key"], key)
    with signed_in_client(base, ADMIN_KEY) as client:
        found = client.get("/console", params={"key": key})
        assert found.status_code == 200, found.text
        assert all(op in found.text for op in [*ours, theirs])
        assert "Operations with the key" in found.text and "completed" in found.text
        assert f'value="{key}"' in found.text  # the box keeps what was searched
        one = client.get("/console", params={"key": f"  {key} ", "tenant": "search-b"})
        assert theirs in one.text and not any(op in one.text for op in ours)
        went = client.get("/console", params={"key": theirs})
        assert went.status_code == 303, went.text
        assert went.headers["location"] == f"/console/operations/{theirs}"
        upper = client.get("/console", params={"key": theirs.upper()})
        assert upper.headers["location"] == f"/console/operations/{theirs}"
        none = client.get("/console", params={"key": "no-such-" + uuid.uuid4().hex})
        assert none.status_code == 200 and "No operation of any tenant has this key" in none.text
        unknown = client.get("/console", params={"key": str(uuid.uuid4())})
        assert unknown.status_code == 404 and "Not found" in unknown.text
    admin = new_principal(base, tenant="search-a", role="admin")["api_key"]
    with signed_in_client(base, admin) as client:
        found = client.get("/console", params={"key": key})
        assert all(op in found.text for op in ours)
        assert theirs not in found.text and "search-b" not in found.text
        assert client.get("/console", params={"key": ours[0]}).status_code == 303
        hidden = client.get("/console", params={"key": theirs})
        assert hidden.status_code == 404, hidden.text
        assert "search-b" not in hidden.text and "Not found" in hidden.text
        elsewhere = client.get("/console", params={"key": key, "tenant": "search-b"})
        assert elsewhere.status_code == 403 and theirs not in elsewhere.text


def test_a_key_used_as_an_operation_id_elsewhere_is_still_found_as_a_key(
    server: ServerProcess,
) -> None:
    """Keys are often UUIDs: a UUID that is no operation the admin may see is searched as
    a key."""
    base = server.base_url
    key = str(uuid.uuid4())
    operation = _opened(base, new_principal(base, tenant="search-u")["api_key"], key)
    with signed_in_client(base, ADMIN_KEY) as client:
        found = client.get("/console", params={"key": key})
        assert found.status_code == 200 and operation in found.text


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        ("k" * 256, "k" * 256),
        ("a\x00b", None),
        ("a\tb", None),
        ("a\nb", None),
        ("a\x7fb", None),
        ("kl\u00e9", "kl\u00e9"),
        ("\u202ek", None),
        ("x" * 5000, None),
    ],
)
def test_a_bad_search_is_a_400_page_that_keeps_what_was_typed(
    server: ServerProcess, app_database: str, typed: str, shown: str | None
) -> None:
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        before = count_rows(app_database)
        refused = client.get("/console", params={"key": typed})
        assert refused.status_code == 400, refused.text
        assert "1 to 255 printable ASCII characters" in refused.text
        assert 'id="q-key"' in refused.text and "Operations with the key" not in refused.text
        if shown is not None:
            assert f'value="{shown}"' in refused.text
        assert_guarded(refused)
        assert count_rows(app_database) == before


def _alarm(database: str, feed: str, event_id: str, detail: str) -> None:
    execute(
        database,
        "INSERT INTO feed_alarms (feed, kind, event_id, detail, event_order) "
        "VALUES (:f, 'conflicting-identity', :e, :d, 7)",
        f=feed,
        e=event_id,
        d=detail,
    )


def test_a_conflicting_identity_is_accepted_with_its_button(
    server: ServerProcess, app_database: str
) -> None:
    """The alarm has an Accept button (with the form token); accepting turns it into a
    ``conflict-accepted`` alarm, with no button. An event twice in one page has none: no
    operator can accept that."""
    feed, event = "accepting", "evt-" + uuid.uuid4().hex[:6]
    execute(app_database, "INSERT INTO feed_checkpoints (name, kind) VALUES (:f, 'cursor')", f=feed)
    _alarm(app_database, feed, event, "evt at 7 has other content than its receipt")
    _alarm(app_database, feed, "twice", "served twice in one page: at 1 and at 2, x")
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        page = client.get("/console/feeds").text
        assert f'aria-label="Accept the feed\'s account of {event}"' in page
        assert "Accept the feed's account of twice" not in page
        token = form_token(page)
        forged = client.post(f"/console/feeds/{feed}/conflicts", data={"event_id": event})
        assert forged.status_code == 403
        accepted = client.post(
            f"/console/feeds/{feed}/conflicts", data={"csrf": token, "event_id": event}
        )
        assert accepted.status_code == 303, accepted.text
        shown = client.get(accepted.headers["location"])
        assert f"The feed&#39;s account of event {event} is accepted" in shown.text
        assert f'data-alarm="conflict-accepted" data-alarm-event="{event}"' in shown.text
        assert f"Accept the feed's account of {event}" not in shown.text
        again = client.post(
            f"/console/feeds/{feed}/conflicts", data={"csrf": token, "event_id": event}
        )
        assert again.status_code == 404, again.text
        for bad in ("", "x" * 256):
            refused = client.post(
                f"/console/feeds/{feed}/conflicts", data={"csrf": token, "event_id": bad}
            )
            assert refused.status_code == 400, refused.text
    kinds = scalar(
        app_database, "SELECT string_agg(kind, ',') FROM feed_alarms WHERE feed = :f", f=feed
    )
    assert sorted(kinds.split(",")) == ["conflict-accepted", "conflicting-identity"]


def test_revoke_asks_first_and_revoking_yourself_signs_you_out(server: ServerProcess) -> None:
    base = server.base_url
    victim = new_principal(base, tenant="revoking")
    me = new_principal(base, tenant="revoking", role="admin")
    with signed_in_client(base, me["api_key"]) as client:
        listed = client.get("/console/principals").text
        assert f'action="/console/principals/{victim["id"]}/revoke"' in listed
        token = form_token(listed)
        asked = client.post(f"/console/principals/{victim['id']}/revoke", data={"csrf": token})
        assert asked.status_code == 200 and "Revoke " + victim["name"] + "?" in asked.text
        assert 'name="confirm" value="revoke"' in asked.text and "signs you out" not in asked.text
        probe = httpx.get(f"{base}/v1/operations/{uuid.uuid4()}", headers=auth(victim["api_key"]))
        assert probe.status_code == 404  # still live: asked, not revoked
        page = client.get(f"/console/principals/{victim['id']}/revoke")
        assert page.status_code == 200 and 'id="confirm-revoke"' in page.text
        done = client.post(
            f"/console/principals/{victim['id']}/revoke",
            data={"csrf": token, "confirm": "revoke"},
        )
        assert done.status_code == 200 and "its key stopped working" in done.text
        probe = httpx.get(f"{base}/v1/operations/{uuid.uuid4()}", headers=auth(victim["api_key"]))
        assert probe.status_code == 401
        mine = client.get(f"/console/principals/{me['id']}/revoke")
        assert "signs you out" in mine.text
        out = client.post(
            f"/console/principals/{me['id']}/revoke", data={"csrf": token, "confirm": "revoke"}
        )
        assert out.status_code == 303 and out.headers["location"] == "/console/sign-in"
        assert "console_session" not in client.cookies
        assert client.get("/console").status_code == 303
    other = new_principal(base, tenant="elsewhere")
    with signed_in_client(
        base, new_principal(base, tenant="revoking", role="admin")["api_key"]
    ) as c:
        hidden = c.get(f"/console/principals/{other['id']}/revoke")
        assert hidden.status_code == 404 and "elsewhere" not in hidden.text


_HREF = re.compile(r'(?:href|action)="(/console[^"]*)"')


def test_a_tenant_admin_is_shown_no_link_that_leads_to_forbidden(server: ServerProcess) -> None:
    """Every link and GET form of the pages a tenant admin reaches answers something other
    than 403 (Feeds is an all-tenant admin's page: not in its menu)."""
    base = server.base_url
    operation = operation_of(base, "links")
    admin = new_principal(base, tenant="links", role="admin")["api_key"]
    with signed_in_client(base, admin) as client:
        seen: set[str] = set()
        for start in ("/console", "/console/principals", f"/console/operations/{operation}"):
            page = client.get(start)
            assert page.status_code == 200, page.text
            assert 'href="/console/feeds"' not in page.text
            for path in set(_HREF.findall(page.text)) - seen:
                seen.add(path)
                if path.startswith("/console/static") or path.endswith(
                    ("/sign-out", "/resolve", "/supersede", "/rotate")
                ):
                    continue
                followed = client.get(path.replace("&amp;", "&"))
                assert followed.status_code != 403, (start, path, followed.text)
    with signed_in_client(base, ADMIN_KEY) as client:
        assert 'href="/console/feeds"' in client.get("/console").text


def test_a_refused_create_keeps_what_was_typed(server: ServerProcess) -> None:
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        token = form_token(client.get("/console/principals").text, "create-form")
        refused = client.post(
            "/console/principals",
            data={"csrf": token, "tenant": "typed-tenant", "name": "bad\tname", "role": "observer"},
        )
        assert refused.status_code == 400 and "Not created" in refused.text
        assert 'value="typed-tenant"' in refused.text
        assert 'value="bad\tname"' in refused.text
        assert "<option selected>observer</option>" in refused.text


def test_a_stalled_feed_is_flagged_on_its_page_and_in_the_metrics(
    server: ServerProcess, app_database: str
) -> None:
    """A hold 42 minutes old (past SETTLEMENT_FEED_STALL_AFTER, 15 minutes by default): the
    feeds page says the feed is stalled behind it, and settlement_feed_stalled_seconds
    says how long; a feed with a fresh hold is not flagged (0)."""
    stalled, fresh = "stalling", "moving"
    for feed, age in ((stalled, 42 * 60), (fresh, 60)):
        execute(
            app_database,
            "INSERT INTO feed_checkpoints (name, kind, updated_at) "
            "VALUES (:f, 'cursor', now() - make_interval(secs => :age))",
            f=feed,
            age=age,
        )
        execute(
            app_database,
            "INSERT INTO feed_receipts (feed, event_id, event_order, operation_id, state, "
            "reason, first_seen_at, decided_at) VALUES (:f, :e, 1, gen_random_uuid(), 'held', "
            "'bad-signature', now() - make_interval(secs => :age), now())",
            f=feed,
            e=f"held-{feed}",
            age=age,
        )
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        page = client.get("/console/feeds").text
        assert (
            f'id="stalled-{stalled}">Stalled for 42 min behind hold held-{stalled} '
            "(bad-signature).</p>" in page
        ), page
        assert f'id="stalled-{fresh}"' not in page

    def figures() -> dict[str, float]:
        text = httpx.get(f"{server.base_url}/metrics", headers=auth(ADMIN_KEY)).text
        found = re.findall(r'settlement_feed_stalled_seconds\{feed="([^"]+)"\} (\S+)', text)
        return {feed: float(value) for feed, value in found}

    shown = until(lambda: stalled in (got := figures()) and got, "the stall in /metrics")
    assert 42 * 60 <= shown[stalled] < 44 * 60 and shown[fresh] == 0.0


def test_a_refused_supersede_keeps_what_was_typed(server: ServerProcess) -> None:
    operation = operation_of(server.base_url, "typed")
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        token = form_token(client.get(f"/console/operations/{operation}").text)
        refused = client.post(
            f"/console/operations/{operation}/supersede",
            data={"csrf": token, "reason": "the <first> try", "force": "on", "confirm": "nope"},
        )
        assert refused.status_code == 409 and "Force was not confirmed" in refused.text
        assert ">the &lt;first&gt; try</textarea>" in refused.text
        assert 'value="nope"' not in refused.text  # force is confirmed anew, never re-filled
        assert re.search(r'id="confirm" name="confirm"[^>]* value=""', refused.text)
        assert re.search(r'id="force" name="force"[^>]* checked>', refused.text)


def test_a_timestamp_feed_is_closed_through_a_readable_utc_time(
    server: ServerProcess, app_database: str
) -> None:
    """The feed contract's Unix seconds are shown as UTC (with the number the feed used)."""
    execute(
        app_database,
        "INSERT INTO feed_checkpoints (name, kind, closed_through_timestamp) "
        "VALUES ('closing', 'timestamp', 1764915331)",
    )
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        page = client.get("/console/feeds").text
        assert "closed through 2025-12-05 06:15:31 UTC (Unix 1764915331)" in page
