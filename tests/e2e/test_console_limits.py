"""The console's limits against a real server: sign-in attempts per client address (429 with
Retry-After, per address, a success not counted), the size of a console form (413 before it
is read), the principals page a page at a time and per tenant, and the per-tenant cap of
live principals (the API and the console refuse one more; concurrent creates never pass it).
Each test connects from its own loopback address (127.0.0.x), so the per-address counts of
one test never reach another's."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, PATIENCE, auth, new_principal, scalar, until
from tests.e2e.console import form_token
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# Sign-ins an address may try per window on this module's server, and the window (seconds):
# short, so a throttled address is let in again within the test.
ATTEMPTS = 3
WINDOW = 4.0
# Live principals a tenant may hold on this module's server.
CAP = 3
PROBLEM = "application/problem+json"
# The console's form limit (service/http/console/security.py FORM_LIMIT).
FORM_LIMIT = 8_192


@pytest.fixture(scope="module")
def server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_CONSOLE_SIGN_IN_ATTEMPTS": str(ATTEMPTS),
        "SETTLEMENT_CONSOLE_SIGN_IN_WINDOW": str(WINDOW),
        "SETTLEMENT_MAX_PRINCIPALS_PER_TENANT": str(CAP),
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


@contextmanager
def browser(base: str, address: str) -> Iterator[httpx.Client]:
    """An HTTP client whose connections come from the loopback ``address``."""
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(base_url=base, timeout=30, transport=transport) as client:
        yield client


def try_sign_in(client: httpx.Client, key: str) -> httpx.Response:
    form = client.get("/console/sign-in")
    assert form.status_code == 200, form.text
    data = {"csrf": form_token(form.text, "sign-in-form"), "api_key": key}
    return client.post("/console/sign-in", data=data)


def spend_attempts(client: httpx.Client) -> httpx.Response:
    """Wrong keys until the address is refused: 401s, then the 429, returned. A window may
    end between two of them once: at most twice the limit before the refusal."""
    answers = []
    for _ in range(2 * ATTEMPTS + 1):
        answers.append(try_sign_in(client, "sk_" + "x" * 43))
        if answers[-1].status_code == 429:
            break
    statuses = [answer.status_code for answer in answers]
    assert statuses[-1] == 429 and set(statuses[:-1]) == {401}, statuses
    return answers[-1]


def test_sign_ins_past_the_limit_answer_429_until_the_window_ends(server: ServerProcess) -> None:
    base = server.base_url
    with browser(base, "127.0.0.2") as client:
        # successes are not counted: many in a row all pass
        for _ in range(ATTEMPTS * 3):
            assert try_sign_in(client, ADMIN_KEY).status_code == 303
        refused = spend_attempts(client)
        if int(refused.headers["retry-after"]) < 2:
            # the window ends within a second: start again at the start of the next one, so
            # that the checks below all fall inside one window
            until(
                lambda: try_sign_in(client, ADMIN_KEY).status_code == 303,
                "the throttled address signs in after its window",
                timeout=WINDOW + PATIENCE,
            )
            refused = spend_attempts(client)
        assert 2 <= int(refused.headers["retry-after"]) <= WINDOW, refused.headers
        assert refused.headers["content-type"].startswith("text/html")
        assert "Too many sign-in attempts" in refused.text
        assert "x-frame-options" in refused.headers  # still a console answer
        # while throttled, the right key is refused too (no session is opened)
        right = try_sign_in(client, ADMIN_KEY)
        assert right.status_code == 429 and "console_session" not in right.cookies
        # another address is not throttled
        with browser(base, "127.0.0.3") as other:
            assert try_sign_in(other, ADMIN_KEY).status_code == 303
        # when the window ends, the address may sign in again
        until(
            lambda: try_sign_in(client, ADMIN_KEY).status_code == 303,
            "the throttled address signs in after its window",
            timeout=WINDOW + PATIENCE,
        )


def test_a_console_form_over_the_limit_is_refused_before_it_is_read(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    with browser(base, "127.0.0.4") as client:
        big = {"csrf": "x", "api_key": "k", "pad": "a" * FORM_LIMIT}
        answer = client.post("/console/sign-in", data=big)
        assert answer.status_code == 413, answer.text
        assert answer.headers["content-type"] == PROBLEM
        assert answer.headers["x-frame-options"] == "DENY"
    with browser(base, "127.0.0.5") as client:
        # 120,000 fields: refused by its length alone
        many = "&".join(f"f{i}=" for i in range(120_000)).encode()
        answer = client.post(
            "/console/sign-in",
            content=many,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert answer.status_code == 413, answer.text
    with browser(base, "127.0.0.6") as client:
        # no Content-Length (chunked): counted as it arrives
        def chunks() -> Iterator[bytes]:
            for _ in range(20):
                yield b"a=" + b"b" * 1000 + b"&"

        answer = client.post(
            "/console/sign-in",
            content=chunks(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert answer.status_code == 413, answer.text
    # a signed-in form too, and nothing is written
    with browser(base, "127.0.0.7") as client:
        assert try_sign_in(client, ADMIN_KEY).status_code == 303
        token = form_token(client.get("/console/principals").text, "create-form")
        big = {"csrf": token, "tenant": "padded", "name": "p", "role": "client"}
        answer = client.post("/console/principals", data={**big, "pad": "a" * FORM_LIMIT})
        assert answer.status_code == 413, answer.text
        assert scalar(app_database, "SELECT count(*) FROM principals WHERE tenant = 'padded'") == 0
        # a form of the largest size the console makes still passes: a 500-character
        # reason of four-byte characters
        operation = uuid.uuid4()
        answer = client.post(
            f"/console/operations/{operation}/supersede",
            data={"csrf": token, "reason": "\U0001f600" * 500, "confirm": str(operation)},
        )
        assert answer.status_code == 404, answer.text  # no such operation: read, not refused


def test_the_principals_page_goes_a_page_at_a_time_and_by_tenant(server: ServerProcess) -> None:
    base = server.base_url
    made: set[str] = set()
    tenants = [f"crowd-{i:02d}" for i in range(60)]
    for tenant in tenants:
        for _ in range(2):
            made.add(new_principal(base, tenant=tenant)["id"])
    with browser(base, "127.0.0.8") as client:
        assert try_sign_in(client, ADMIN_KEY).status_code == 303
        seen: list[str] = []
        path: str | None = "/console/principals"
        while path is not None:
            page = client.get(path)
            assert page.status_code == 200, page.text
            rows = re.findall(r'data-principal="([0-9a-f-]+)"', page.text)
            assert 0 < len(rows) <= 100
            seen += rows
            found = re.search(r'id="next-page" href="([^"]+)"', page.text)
            path = None if found is None else found.group(1).replace("&amp;", "&")
        assert len(seen) == len(set(seen)), "a principal listed twice"
        assert made <= set(seen)
        # the bootstrap admin is one filter away, whatever the crowd
        system = client.get("/console/principals", params={"tenant": "system"})
        assert system.status_code == 200 and "bootstrap-admin" in system.text
        one = client.get("/console/principals", params={"tenant": tenants[0]})
        assert len(re.findall(r'data-principal="', one.text)) == 2
        for hostile in ("%", "a b", "x" * 129, "\x00", "é", "../x"):
            refused = client.get("/console/principals", params={"tenant": hostile})
            assert refused.status_code == 400, (hostile, refused.text)
        for cursor in ("x", "1.2", "9" * 17 + "." + "0" * 32, "1." + "G" * 32, "\u0661.a", ""):
            answer = client.get("/console/principals", params={"before": cursor})
            assert answer.status_code in (200, 400), (cursor, answer.text)
            assert answer.status_code == 200 or "cursor" in answer.text
        last = client.get("/console/principals", params={"before": "0." + "0" * 32})
        assert last.status_code == 200 and "data-principal" not in last.text
    # a tenant admin sees its own tenant, and may not ask for another
    admin = new_principal(base, tenant=tenants[1], role="admin")["api_key"]
    with browser(base, "127.0.0.9") as client:
        assert try_sign_in(client, admin).status_code == 303
        own = client.get("/console/principals")
        assert {t for t in re.findall(r"crowd-\d\d", own.text)} == {tenants[1]}
        assert client.get("/console/principals", params={"tenant": tenants[0]}).status_code == 403
        assert client.get("/console/principals", params={"tenant": "system"}).status_code == 403


def create(base: str, tenant: str, name: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{base}/admin/v1/principals",
        json={"tenant": tenant, "name": name or uuid.uuid4().hex, "role": "client"},
        headers=auth(ADMIN_KEY),
        timeout=30,
    )


def test_a_tenant_holds_at_most_the_cap_of_live_principals(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    made = [create(base, "capped") for _ in range(CAP)]
    assert [answer.status_code for answer in made] == [201] * CAP
    refused = create(base, "capped")
    assert refused.status_code == 409 and refused.headers["content-type"] == PROBLEM
    problem = refused.json()
    assert problem["type"] == "/problems/principal-limit", problem
    assert "SETTLEMENT_MAX_PRINCIPALS_PER_TENANT" in problem["detail"]
    # another tenant is not affected; a revoked principal leaves room for one more
    assert create(base, "uncapped").status_code == 201
    revoked = httpx.post(
        f"{base}/admin/v1/principals/{made[0].json()['id']}/revoke", headers=auth(ADMIN_KEY)
    )
    assert revoked.status_code == 200, revoked.text
    assert create(base, "capped").status_code == 201
    assert create(base, "capped").status_code == 409
    # the console refuses it on the principals page
    with browser(base, "127.0.0.10") as client:
        assert try_sign_in(client, ADMIN_KEY).status_code == 303
        token = form_token(client.get("/console/principals").text, "create-form")
        answer = client.post(
            "/console/principals",
            data={"csrf": token, "tenant": "capped", "name": "one-more", "role": "client"},
        )
        assert answer.status_code == 409, answer.text
        assert "SETTLEMENT_MAX_PRINCIPALS_PER_TENANT" in answer.text
        assert 'id="create-form"' in answer.text  # the page, with its form, not a dead end
    # concurrent creates in a fresh tenant: exactly the cap get through
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: create(base, "raced").status_code, range(12)))
    assert sorted(answers) == [201] * CAP + [409] * (12 - CAP), answers


HOSTILE = [
    "",
    "\x00",
    "\u00b2",
    "9" * 5000,
    "%2e%2e",
    "/console/%2e%2e/metrics",
    "\r\nLocation: x",
    "\ud7ff" * 50,
    "' OR 1=1 --",
    "<script>alert(1)</script>",
    "\\..\\",
    "a" * 2000,
]


def test_hostile_values_in_the_console_parameters_never_get_a_5xx(
    server: ServerProcess, app_database: str
) -> None:
    base = server.base_url
    with browser(base, "127.0.0.11") as client:
        assert try_sign_in(client, ADMIN_KEY).status_code == 303
        token = form_token(client.get("/console/principals").text, "create-form")
        for value in HOSTILE:
            for path, name in (
                ("/console", "older"),
                ("/console", "after"),
                ("/console", "tenant"),
                ("/console/principals", "tenant"),
                ("/console/principals", "before"),
                ("/console/sign-in", "next"),
            ):
                answer = client.get(path, params={name: value})
                assert answer.status_code in (200, 400, 403), (path, name, value, answer.text)
            for data in (
                {"csrf": token, "tenant": value, "name": value, "role": value},
                {"csrf": token, "tenant": "hostile", "name": value, "role": "client"},
            ):
                answer = client.post("/console/principals", data=data)
                assert answer.status_code < 500, (data, answer.text)
    with browser(base, "127.0.0.12") as client:
        for value in HOSTILE:
            form = client.get("/console/sign-in")
            data = {"csrf": form_token(form.text, "sign-in-form"), "api_key": value, "next": value}
            answer = client.post("/console/sign-in", data=data)
            # a wrong key, a body past the form limit, or the address throttled
            assert answer.status_code in (401, 413, 429), (value, answer.text)
