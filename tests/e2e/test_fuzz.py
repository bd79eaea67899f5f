"""Property-based fuzzing of the real server over HTTP.

Whatever arrives (any JSON, any bytes, any header value, any path segment or query), the
answer is a documented outcome or an RFC 9457 problem, never a 5xx, and a refusal writes
nothing. The request rules themselves (body schemas, Idempotency-Key syntax) are properties
of the functions that apply them in tests/unit/test_request_rules.py; here the server must
give the answers those rules name (written in tests/contract.py), with the business
outcome, the replay and the rows that only a running server has.

U+0000 gets explicit regression tests at the end of the file: PostgreSQL text cannot hold
it, so it must be refused before it reaches a statement.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_from_bytes

import asyncpg
import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from service.app.routes import SCHEMA as metadata
from tests.contract import (
    HEADER_CHARS,
    IDEMPOTENCY_KEYS,
    JSON_VALUES,
    MAX_AMOUNT,
    SCALAR_CHARS,
    encode_json,
    expected_key,
    transfer_bodies,
    transfer_is_valid,
)
from tests.e2e.client import ADMIN_KEY, new_account, new_principal
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# A request not answered by then is a hang, and fails the example.
REQUEST_TIMEOUT = 10.0

PROBLEM = "application/problem+json"
JSON_TYPE = ("Content-Type", "application/json")
# Business outcomes of the ledger routes: terminal `failed`, stored and replayed (rows written).
BUSINESS = {
    "insufficient-funds": 402,
    "account-not-found": 404,
    "currency-mismatch": 422,
    "balance-limit": 422,
}
FUNDED_BALANCE = 10**6
BEARER = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +(.*?) *")
# Longest Authorization value the server examines (service/http/auth.py).
MAX_AUTHORIZATION = 512


# -- database and HTTP plumbing --------------------------------------------------------------


class RowCounter:
    """The row count of every table, in one statement on one connection kept open."""

    def __init__(self, database_url: str) -> None:
        dsn = make_url(database_url).set(drivername="postgresql")
        self._runner = asyncio.Runner()
        self._conn = self._runner.run(asyncpg.connect(dsn.render_as_string(hide_password=False)))
        self._sql = "SELECT " + ", ".join(
            f'(SELECT count(*) FROM "{name}") AS "{name}"' for name in sorted(metadata.tables)
        )

    def __call__(self) -> dict[str, int]:
        row = self._runner.run(self._conn.fetchrow(self._sql))
        return {name: int(value) for name, value in row.items()}

    def close(self) -> None:
        self._runner.run(self._conn.close())
        self._runner.close()


@pytest.fixture(scope="module")
def rows(app_database: str) -> Iterator[RowCounter]:
    counter = RowCounter(app_database)
    yield counter
    counter.close()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=REQUEST_TIMEOUT) as client:
        yield client


@dataclass
class Ledger:
    """One client principal with accounts, one operation under a known key, and a foreign
    tenant's account."""

    key: str
    funded: str
    empty: str
    dollars: str
    foreign: str
    known_key: str
    operation_id: str


@pytest.fixture(scope="module")
def ledger(server: ServerProcess, http: httpx.Client) -> Ledger:
    base = server.base_url
    key = new_principal(base, tenant="fuzz")["api_key"]
    other = new_principal(base, tenant="fuzz-other")["api_key"]
    known_key = "known-" + uuid.uuid4().hex
    opened = http.post(
        "/v1/accounts",
        json={"currency": "EUR", "opening_balance": FUNDED_BALANCE},
        headers={"Authorization": f"Bearer {key}", "Idempotency-Key": known_key},
    )
    assert opened.status_code == 201, opened.text
    return Ledger(
        key=key,
        funded=opened.json()["id"],
        empty=new_account(base, key, 0),
        dollars=new_account(base, key, 500, currency="USD"),
        foreign=new_account(base, other, 500),
        known_key=known_key,
        operation_id=opened.headers["operation-id"],
    )


def bearer(key: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {key}")


def show(response: httpx.Response) -> str:
    request = response.request
    sent = {k: v for k, v in request.headers.items() if k.lower() != "authorization"}
    return (
        f"\n{request.method} {request.url} headers={sent} body={request.content[:300]!r}"
        f"\n-> {response.status_code} {dict(response.headers)} {response.text[:500]!r}"
    )


def refused_by_the_parser(response: httpx.Response) -> bool:
    """The HTTP server's own 400 for a request its parser refuses (granian's: no body, no
    content type, the connection closed, before the app runs)."""
    return (
        response.status_code == 400
        and "content-type" not in response.headers
        and not response.content
    )


def assert_problem(response: httpx.Response, slug: str | None = None) -> str:
    """An RFC 9457 problem document whose status is the HTTP status; returns its slug."""
    assert response.headers.get("content-type") == PROBLEM, show(response)
    problem = response.json()
    assert isinstance(problem, dict), show(response)
    kind = problem.get("type")
    assert isinstance(kind, str), show(response)
    assert kind.startswith("/problems/"), show(response)
    assert problem.get("status") == response.status_code, show(response)
    for name in ("title", "detail"):
        assert isinstance(problem.get(name), str), show(response)
        assert problem[name], show(response)
    if slug is not None:
        assert kind == f"/problems/{slug}", show(response)
    return kind.removeprefix("/problems/")


def assert_idempotent_answer(
    response: httpx.Response, before: dict[str, int], after: dict[str, int]
) -> str | None:
    """The invariants of every answer of an idempotent route; returns the problem slug."""
    assert response.status_code < 500, show(response)
    assert response.headers.get("idempotent-replayed") in ("true", "false"), show(response)
    if response.status_code < 400:
        assert response.status_code == 201, show(response)
        assert response.headers.get("content-type") == "application/json", show(response)
        return None
    slug = assert_problem(response)
    if slug in BUSINESS:
        assert response.status_code == BUSINESS[slug], show(response)
        assert response.headers.get("operation-id"), show(response)
    else:
        assert after == before, f"rows written by a refusal: {before} -> {after}{show(response)}"
    return slug


CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ]
)
JSON_CONTENT_TYPES = ("application/json",)
IDEMPOTENT_ROUTES = st.sampled_from(["/v1/accounts", "/v1/transfers"])


# -- 1. arbitrary JSON and bytes as the body of an idempotent route -------------------------


def post_body(
    http: httpx.Client, ledger: Ledger, route: str, content: bytes, content_type: str | None
) -> httpx.Response:
    headers = [bearer(ledger.key), ("Idempotency-Key", uuid.uuid4().hex)]
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    return http.post(route, content=content, headers=headers)


@FUZZ
@given(
    route=IDEMPOTENT_ROUTES,
    value=JSON_VALUES,
    ascii_only=st.booleans(),
    content_type=CONTENT_TYPES,
)
def test_arbitrary_json_bodies_get_a_documented_answer(
    http: httpx.Client,
    rows: RowCounter,
    ledger: Ledger,
    route: str,
    value: Any,
    ascii_only: bool,
    content_type: str | None,
) -> None:
    before = rows()
    response = post_body(http, ledger, route, encode_json(value, ascii_only), content_type)
    slug = assert_idempotent_answer(response, before, rows())
    event(f"{route}: {response.status_code} {slug or ''}")


@FUZZ
@given(route=IDEMPOTENT_ROUTES, content=st.binary(max_size=2048), content_type=CONTENT_TYPES)
def test_arbitrary_bytes_bodies_get_a_documented_answer(
    http: httpx.Client,
    rows: RowCounter,
    ledger: Ledger,
    route: str,
    content: bytes,
    content_type: str | None,
) -> None:
    before = rows()
    response = post_body(http, ledger, route, content, content_type)
    slug = assert_idempotent_answer(response, before, rows())
    event(f"{route}: {response.status_code} {slug or ''}")
    if content_type not in JSON_CONTENT_TYPES:  # refused before a byte is decoded
        assert slug == "unsupported-media-type", show(response)
    elif route == "/v1/transfers":  # no byte string names two accounts of this tenant
        assert slug == "validation-error", show(response)


# -- 2. mutations of a valid transfer --------------------------------------------------------

# -- 2. mutations of a valid transfer --------------------------------------------------------


def read_account(http: httpx.Client, ledger: Ledger, account: uuid.UUID) -> dict[str, Any] | None:
    response = http.get(f"/v1/accounts/{account}", headers=[bearer(ledger.key)])
    if response.status_code == 404:
        return None
    assert response.status_code == 200, show(response)
    found: dict[str, Any] = response.json()
    return found


@FUZZ
@given(data=st.data())
def test_transfer_body_mutations_are_validated_by_the_contract(
    http: httpx.Client, rows: RowCounter, ledger: Ledger, data: st.DataObject
) -> None:
    mine, others = [ledger.funded, ledger.empty, ledger.dollars], [ledger.foreign]
    body = data.draw(transfer_bodies(mine, others), label="body")
    ascii_only = data.draw(st.booleans(), label="ascii_only")
    valid = transfer_is_valid(body)
    expected: tuple[int, str | None] = (400, "validation-error")
    balances: dict[uuid.UUID, int] = {}
    if valid:
        source, destination = uuid.UUID(body["source"]), uuid.UUID(body["destination"])
        accounts = {a: read_account(http, ledger, a) for a in (source, destination)}
        balances = {a: found["balance"] for a, found in accounts.items() if found is not None}
        if None in accounts.values():
            expected = (404, "account-not-found")
        elif any(found["currency"] != body["currency"] for found in accounts.values()):
            expected = (422, "currency-mismatch")
        elif balances[source] < body["amount"]:
            expected = (402, "insufficient-funds")
        elif balances[destination] + body["amount"] > MAX_AMOUNT:
            expected = (422, "balance-limit")
        else:
            expected = (201, None)
    before = rows()

    response = http.post(
        "/v1/transfers",
        content=encode_json(body, ascii_only),
        headers=[bearer(ledger.key), ("Idempotency-Key", uuid.uuid4().hex), JSON_TYPE],
    )

    after = rows()
    slug = assert_idempotent_answer(response, before, after)
    assert (response.status_code, slug) == expected, show(response)
    event(f"{response.status_code} {slug or ''}")
    assert response.headers["idempotent-replayed"] == "false", show(response)
    if valid:
        assert after["operations"] == before["operations"] + 1, show(response)
    if expected[0] == 201:
        made = response.json()
        assert made["source"] == str(source), show(response)
        assert made["destination"] == str(destination), show(response)
        assert (made["amount"], made["currency"]) == (body["amount"], body["currency"])
        assert made["memo"] == body.get("memo"), show(response)
        assert after["transfers"] == before["transfers"] + 1, show(response)
        moved = {a: read_account(http, ledger, a) for a in (source, destination)}
        assert moved[source] == {**moved[source], "balance": balances[source] - body["amount"]}
        assert moved[destination] == {
            **moved[destination],
            "balance": balances[destination] + body["amount"],
        }
    else:
        assert after["transfers"] == before["transfers"], show(response)


# -- 3. Idempotency-Key header values --------------------------------------------------------


@dataclass
class KeyCaller:
    key: str
    seen: set[str] = field(default_factory=set)


@pytest.fixture(scope="module")
def key_caller(server: ServerProcess) -> KeyCaller:
    return KeyCaller(key=new_principal(server.base_url, tenant="fuzz-keys")["api_key"])


@FUZZ
@given(value=IDEMPOTENCY_KEYS, copies=st.sampled_from([1, 1, 1, 1, 2]))
def test_idempotency_key_values_are_judged_by_the_rule(
    http: httpx.Client, rows: RowCounter, key_caller: KeyCaller, value: str, copies: int
) -> None:
    raw = value.encode("latin-1").strip(b" \t")
    key = expected_key(raw.decode("latin-1")) if copies == 1 else None
    before = rows()

    response = http.post(
        "/v1/accounts",
        content=b'{"currency":"EUR"}',
        headers=[bearer(key_caller.key), JSON_TYPE] + [("Idempotency-Key", raw)] * copies,
    )

    if refused_by_the_parser(response):
        # the server's HTTP parser refuses a control character in a header value, before the app
        assert any((c < 0x20 and c != 0x09) or c == 0x7F for c in raw), show(response)
        assert (key, rows()) == (None, before), show(response)
        event("refused by the HTTP parser")
        return
    slug = assert_idempotent_answer(response, before, rows())
    event("valid key" if key is not None else "invalid key")
    if key is None:
        assert slug == "idempotency-key-invalid", show(response)
        return
    assert response.status_code == 201, show(response)
    replayed = "true" if key in key_caller.seen else "false"
    assert response.headers["idempotent-replayed"] == replayed, show(response)
    key_caller.seen.add(key)
    status = http.get("/v1/operations", params={"key": key}, headers=[bearer(key_caller.key)])
    assert status.status_code == 200, show(status)
    view = status.json()
    assert (view["id"], view["key"]) == (response.headers["operation-id"], key), show(status)


# -- 4. Authorization header values ----------------------------------------------------------


@st.composite
def authorizations(draw: st.DrawFn, real: str) -> str:
    prefix = draw(
        st.sampled_from(
            ["Bearer ", "bearer ", "BEARER   ", "Bearer", "Bearer\t", "Basic ", "Token ", ""]
        )
    )
    token = draw(
        st.one_of(
            st.text(HEADER_CHARS, max_size=60),
            st.text(HEADER_CHARS, min_size=390, max_size=600),
            st.just(real),
            st.integers(0, len(real) - 1).map(lambda n: real[:n]),
            st.text(HEADER_CHARS, min_size=1, max_size=3).map(lambda s: real + s),
            st.text(HEADER_CHARS, min_size=1, max_size=3).map(lambda s: s + real),
            st.just(real.swapcase()),
            st.just(real.replace("_", "-", 1)),
            st.just(real + " " + real),
        )
    )
    return prefix + token + draw(st.sampled_from(["", " ", "  "]))


def authenticates(raw: bytes, real: str) -> bool:
    """Bearer (any case), one or more spaces, exactly the key, optional spaces."""
    text = raw.decode("latin-1").strip(" \t")
    match = BEARER.fullmatch(text)
    return len(text) <= MAX_AUTHORIZATION and match is not None and match.group(1) == real


@FUZZ
@given(data=st.data())
def test_authorization_values_are_unauthenticated_unless_exactly_the_key(
    http: httpx.Client, rows: RowCounter, ledger: Ledger, data: st.DataObject
) -> None:
    value = data.draw(authorizations(ledger.key), label="authorization")
    target = data.draw(st.sampled_from(["post-account", "get-account", "get-operation"]))
    raw = value.encode("latin-1").strip(b" \t")
    headers: list[tuple[str, str | bytes]] = [("Authorization", raw)]
    before = rows()

    if target == "post-account":
        headers.append(("Idempotency-Key", uuid.uuid4().hex))
        response = http.post("/v1/accounts", json={"currency": "EUR"}, headers=headers)
    elif target == "get-account":
        response = http.get(f"/v1/accounts/{ledger.funded}", headers=headers)
    else:
        response = http.get(f"/v1/operations/{ledger.operation_id}", headers=headers)

    if refused_by_the_parser(response):
        # the server's HTTP parser refuses a control character in a header value, before the app
        assert any((c < 0x20 and c != 0x09) or c == 0x7F for c in raw), show(response)
        assert rows() == before, show(response)
        event("refused by the HTTP parser")
        return
    if target == "post-account":
        assert response.headers.get("idempotent-replayed") == "false", show(response)
    assert response.status_code < 500, show(response)
    event(f"{target}: {response.status_code}")
    if authenticates(raw, ledger.key):
        assert response.status_code == (201 if target == "post-account" else 200), show(response)
    else:
        assert response.status_code == 401, show(response)
        assert_problem(response, "unauthenticated")
        assert rows() == before, show(response)


# -- 5. path segments and the ?key= query ----------------------------------------------------


@st.composite
def path_segments(draw: st.DrawFn, own: str) -> tuple[str, str]:
    """(the segment as sent, percent-encoded or raw; the text it decodes to)."""
    text = st.text(SCALAR_CHARS, max_size=60)
    spelled = st.one_of(
        st.just(own),
        st.just(own.upper()),
        st.just(uuid.UUID(own).hex),
        st.just("{" + own + "}"),
        st.just("urn:uuid:" + own),
        st.uuids().map(str),
        st.uuids().map(lambda u: u.hex.upper()),
        text,
    )
    kind = draw(st.sampled_from(["text", "bytes", "raw"]))
    if kind == "text":
        segment = draw(spelled)
        return quote(segment, safe=""), segment
    if kind == "bytes":
        blob = draw(st.binary(max_size=40))
        return quote_from_bytes(blob, safe=""), blob.decode("utf-8", "replace")
    raw = draw(
        st.sampled_from(["", ".", "..", "%", "%2", "%zz", "%00", "%2F", "a/b", "%2e%2e", ";x"])
    )
    return raw, raw


def names_own(text: str, own: str) -> bool:
    try:
        return uuid.UUID(text) == uuid.UUID(own)
    except ValueError:
        return False


@FUZZ
@given(data=st.data(), collection=st.sampled_from(["accounts", "operations"]))
def test_path_segments_get_a_problem_or_the_own_resource(
    http: httpx.Client, rows: RowCounter, ledger: Ledger, data: st.DataObject, collection: str
) -> None:
    own = ledger.funded if collection == "accounts" else ledger.operation_id
    sent, text = data.draw(path_segments(own), label="segment")
    before = rows()

    response = http.get(f"/v1/{collection}/{sent}", headers=[bearer(ledger.key)])

    assert response.status_code < 500, show(response)
    assert rows() == before, show(response)
    event(f"{collection}: {response.status_code}")
    if response.status_code == 200:
        assert names_own(text, own), show(response)
        assert response.json()["id"] == own, show(response)
        return
    assert text != own, show(response)
    assert response.status_code in (400, 404, 405), show(response)
    assert_problem(response)


@FUZZ
@given(data=st.data())
def test_operation_key_queries_get_a_problem_or_the_own_operation(
    http: httpx.Client, rows: RowCounter, ledger: Ledger, data: st.DataObject
) -> None:
    kind = data.draw(st.sampled_from(["text", "long", "bytes", "known"]), label="kind")
    if kind == "bytes":
        blob = data.draw(st.binary(max_size=60), label="key")
        query, key = "key=" + quote_from_bytes(blob, safe=""), None
    else:
        strategies = {
            "text": st.text(SCALAR_CHARS, max_size=40),
            "long": st.text(SCALAR_CHARS, min_size=250, max_size=300),
            "known": st.just(ledger.known_key),
        }
        key = data.draw(strategies[kind], label="key")
        query = "key=" + quote(key, safe="")
    route = data.draw(
        st.one_of(
            st.none(),
            st.sampled_from(["POST /v1/accounts", "POST /v1/transfers", ""]),
            st.text(SCALAR_CHARS, max_size=30),
        ),
        label="route",
    )
    if route is not None:
        query += "&route=" + quote(route, safe="")
    before = rows()

    response = http.get(f"/v1/operations?{query}", headers=[bearer(ledger.key)])

    assert response.status_code < 500, show(response)
    assert rows() == before, show(response)
    event(f"{kind}: {response.status_code}")
    if key == ledger.known_key and route in (None, "POST /v1/accounts"):
        assert response.status_code == 200, show(response)
        assert response.json()["id"] == ledger.operation_id, show(response)
        return
    slug = assert_problem(response)
    either = ((400, "validation-error"), (404, "not-found"))
    if key is None or "\x00" in key or (route is not None and "\x00" in route):
        assert (response.status_code, slug) in either, show(response)
    elif 1 <= len(key) <= 255:
        assert (response.status_code, slug) == (404, "not-found"), show(response)
    else:
        assert (response.status_code, slug) == (400, "validation-error"), show(response)


# -- 6. every route, every role, hostile everything -----------------------------------------

# (method, path template) of every route the server serves; {id} is a path parameter.
EVERY_ROUTE = [
    ("GET", "/health"),
    ("GET", "/livez"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/problems/{id}"),
    ("POST", "/v1/accounts"),
    ("GET", "/v1/accounts/{id}"),
    ("POST", "/v1/transfers"),
    ("POST", "/v1/payouts"),
    ("GET", "/v1/operations"),
    ("GET", "/v1/operations/{id}"),
    ("POST", "/v1/observations"),
    ("POST", "/admin/v1/principals"),
    ("POST", "/admin/v1/principals/{id}/rotate"),
    ("POST", "/admin/v1/principals/{id}/revoke"),
    ("POST", "/admin/v1/operations/{id}/supersede"),
    ("GET", "/admin/v1/operations"),
    ("GET", "/admin/v1/feeds"),
    ("GET", "/admin/v1/feeds/{id}"),
    ("POST", "/admin/v1/feeds/{id}/holds/{id}"),
    ("GET", "/console"),
    ("GET", "/console/sign-in"),
    ("POST", "/console/sign-in"),
    ("POST", "/console/sign-out"),
    ("GET", "/console/operations/{id}"),
    ("POST", "/console/operations/{id}/supersede"),
    ("GET", "/console/feeds"),
    ("POST", "/console/feeds/{id}/holds"),
    ("GET", "/console/principals"),
    ("POST", "/console/principals"),
    ("POST", "/console/principals/{id}/{id}"),
]
# The console's pages answer a browser: a refusal there is an HTML page (or a redirect to
# sign in), with the console's security headers, never a 5xx and never a write.
CONSOLE = "/console"
# Field names the routes' schemas know, so generated objects reach their validators.
FIELD_NAMES = [
    "source", "destination", "amount", "currency", "memo", "opening_balance", "beneficiary",
    "tenant", "name", "role", "reason", "force", "rebind", "request", "evidence", "signature",
    "operation_id", "binding_generation", "request_fingerprint", "outcome", "result",
    "result_digest", "issued_at", "status", "body", "action",
]  # fmt: skip
BIG = [
    "x" * 100_000,
    "\u00e9\U0001f4a9" * 20_000,
    "\x00" * 1000,
    "a\x00b",
    "\ud800",
    2**70,
    -(2**70),
    10**400,
]
HOSTILE_VALUES = st.one_of(JSON_VALUES, st.sampled_from(BIG))
HOSTILE_BODIES = st.one_of(
    st.none(),
    st.binary(max_size=512),
    st.sampled_from([b"[" * 1000 + b"]" * 1000, b'{"a":' * 600 + b"1" + b"}" * 600]),
    st.sampled_from([b"{" + b" " * 1_100_000 + b"}", b"x" * 1_100_000]),  # over the body limit
    JSON_VALUES.map(lambda v: encode_json(v, ascii_only=False)),
    st.dictionaries(
        st.one_of(st.sampled_from(FIELD_NAMES), st.text(SCALAR_CHARS, max_size=8)),
        HOSTILE_VALUES,
        max_size=8,
    ).map(lambda v: encode_json(v, ascii_only=True)),
)
ODD_CONTENT_TYPES = st.one_of(
    CONTENT_TYPES,
    st.sampled_from(["application/problem+json", "APPLICATION/JSON", "application/json;", ""]),
    st.text(HEADER_CHARS, max_size=40),
)
ODD_HEADERS = st.sampled_from(
    [
        "Prefer",
        "Idempotency-Key",
        "Accept",
        "Content-Encoding",
        "Transfer-Encoding",
        "X-Forwarded-For",
        "Traceparent",
        "Range",
        "Expect",
    ]
)


@st.composite
def path_parameters(draw: st.DrawFn, ledger: Ledger) -> str:
    kind = draw(st.sampled_from(["own", "random", "text", "raw"]))
    if kind == "own":
        return draw(st.sampled_from([ledger.funded, ledger.operation_id]))
    if kind == "random":
        return str(draw(st.uuids()))
    if kind == "text":
        return quote(draw(st.text(SCALAR_CHARS, max_size=40)), safe="")
    return draw(st.sampled_from(["", "%00", "%zz", "..", "a/b", "%2F", "0" * 5000]))


@st.composite
def query_strings(draw: st.DrawFn) -> str:
    names = st.one_of(
        st.sampled_from(["key", "route", "state", "tenant", "limit", "after"]),
        st.text(SCALAR_CHARS, max_size=8),
    )
    values = st.one_of(
        st.sampled_from(["unknown", "conflict", "in_progress", "0", "-1", "10000000000", "%00"]),
        st.text(SCALAR_CHARS, max_size=60),
        st.just("q" * 5000),
    )
    pairs = draw(st.lists(st.tuples(names, values), max_size=4))
    return "&".join(quote(k, safe="") + "=" + quote(v, safe="%") for k, v in pairs)


@FUZZ
@given(data=st.data(), route=st.sampled_from(EVERY_ROUTE))
def test_every_route_answers_hostile_requests_with_a_problem_and_writes_nothing(
    http: httpx.Client,
    rows: RowCounter,
    ledger: Ledger,
    observer_key: str,
    console_session: str,
    data: st.DataObject,
    route: tuple[str, str],
) -> None:
    method, template = route
    path = template.replace("{id}", data.draw(path_parameters(ledger), label="id"))
    query = data.draw(query_strings(), label="query")
    who = data.draw(
        st.sampled_from(["admin", "client", "observer", "none", "garbage", "console"]),
        label="who",
    )
    keys = {"admin": ADMIN_KEY, "client": ledger.key, "observer": observer_key}
    headers: list[tuple[str, str | bytes]] = []
    if who in keys:
        headers.append(bearer(keys[who]))
    elif who == "garbage":
        headers.append(("Authorization", data.draw(st.text(HEADER_CHARS, max_size=80))))
    elif who == "console":  # a live console session (its forms' token is never sent)
        headers.append(("Cookie", f"console_session={console_session}"))
    content_type = data.draw(ODD_CONTENT_TYPES, label="content-type")
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    for name in data.draw(st.lists(ODD_HEADERS, max_size=3), label="odd headers"):
        headers.append((name, data.draw(st.text(HEADER_CHARS, max_size=300), label=name)))
    body = data.draw(HOSTILE_BODIES, label="body")
    raw_headers = [(k, v.encode("latin-1") if isinstance(v, str) else v) for k, v in headers]
    before = rows()

    try:
        response = http.request(
            method, path + ("?" + query if query else ""), content=body, headers=raw_headers
        )
    except httpx.LocalProtocolError:  # a header httpx itself will not send
        return

    assert response.status_code < 500, show(response)
    event(f"{method} {template}: {response.status_code}")
    # the client resolves dot segments first: /console/principals/../.. is a request for /
    if template.startswith(CONSOLE) and response.request.url.path.startswith(CONSOLE):
        assert_console_answer(response)
        assert rows() == before, show(response)
    elif response.status_code >= 400:
        if not refused_by_the_parser(response):
            assert_problem(response)
        assert rows() == before, show(response)
    elif method == "GET":
        assert rows() == before, show(response)


def assert_console_answer(response: httpx.Response) -> None:
    """A console answer: a page, a redirect (to sign in, or another console page) or a
    problem document, each with the console's security headers."""
    if refused_by_the_parser(response):
        return
    csp = response.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in csp, show(response)
    assert response.headers.get("x-frame-options") == "DENY", show(response)
    assert response.headers.get("cache-control") == "no-store", show(response)
    if response.status_code in (302, 303):
        assert response.headers["location"].startswith(CONSOLE + "/"), show(response)
    elif response.headers.get("content-type") == PROBLEM:
        assert_problem(response)
    else:
        assert response.headers.get("content-type", "").startswith("text/html"), show(response)


@pytest.fixture(scope="module")
def observer_key(server: ServerProcess) -> str:
    return str(new_principal(server.base_url, role="observer")["api_key"])


@pytest.fixture(scope="module")
def console_session(server: ServerProcess) -> str:
    """The id of a console session of the bootstrap admin."""
    from tests.e2e.console import signed_in_client

    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        return str(client.cookies["console_session"])


# -- U+0000 -----------------------------------------------------------------------------------


def test_memo_with_nul_is_refused_and_writes_nothing(
    http: httpx.Client, rows: RowCounter, ledger: Ledger
) -> None:
    body = {
        "source": ledger.funded,
        "destination": ledger.empty,
        "amount": 1,
        "currency": "EUR",
        "memo": "a\x00b",
    }
    before = rows()
    response = http.post(
        "/v1/transfers",
        content=encode_json(body, ascii_only=True),
        headers=[bearer(ledger.key), ("Idempotency-Key", uuid.uuid4().hex), JSON_TYPE],
    )
    assert response.status_code == 400, show(response)
    assert_problem(response, "validation-error")
    assert response.headers["idempotent-replayed"] == "false", show(response)
    assert rows() == before, show(response)


@pytest.mark.parametrize("query", ["key=a%00b", "key=%00", "key=k&route=POST%20/v1/accounts%00"])
def test_operation_lookup_with_nul_is_a_problem(
    http: httpx.Client, ledger: Ledger, query: str
) -> None:
    response = http.get(f"/v1/operations?{query}", headers=[bearer(ledger.key)])
    assert response.status_code in (400, 404), show(response)
    assert_problem(response)
