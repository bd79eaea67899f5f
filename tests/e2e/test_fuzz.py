"""Property-based fuzzing of the real server over HTTP.

Whatever arrives (any JSON, any bytes, any header value, any path segment or query), the
answer is a documented outcome or an RFC 9457 problem, never a 5xx, and a refusal writes
nothing. Where the contract states a rule (body schema, Idempotency-Key syntax, Bearer
credentials), the expected answer is computed here from the rule and the server must agree.

U+0000 gets explicit regression tests at the end of the file: PostgreSQL text cannot hold
it, so it must be refused before it reaches a statement.
"""

from __future__ import annotations

import asyncio
import json
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

from service.domain.currencies import ISO_4217
from service.store.tables import metadata
from tests.e2e.client import new_account, new_principal
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
# Business outcomes of the ledger routes: terminal `failed`, stored and replayed (rows written).
BUSINESS = {
    "insufficient-funds": 402,
    "account-not-found": 404,
    "currency-mismatch": 422,
    "balance-limit": 422,
}
MAX_AMOUNT = 10**15
MEMO_LIMIT = 512
FUNDED_BALANCE = 10**6
TRANSFER_FIELDS = ("source", "destination", "amount", "currency", "memo")
REQUIRED_TRANSFER_FIELDS = frozenset(TRANSFER_FIELDS[:4])
UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32}"
)
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


# -- strategies ------------------------------------------------------------------------------

# Unicode including control characters and the usual troublemakers; TEXT_CHARS adds lone
# surrogates (only JSON escapes can carry them).
SCALAR_CHARS = st.one_of(
    st.characters(codec="utf-8"),
    st.characters(max_codepoint=0x1F),
    st.sampled_from('"\\/\x00\x7f\u2028\ufeff\U0001f4a9'),
)
TEXT_CHARS = st.one_of(SCALAR_CHARS, st.characters(categories=["Cs"]))
EDGE_INTEGERS = [0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64]
EDGE_NUMBERS = st.sampled_from(
    [*EDGE_INTEGERS, 10**15, 10**15 + 1, 10**400, -(10**400), 1e308, -1e308, 5e-324, -0.0, 1.0]
)
JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    EDGE_NUMBERS,
    st.floats(),  # NaN and Infinity included: json.dumps writes them as invalid JSON tokens
    st.text(TEXT_CHARS, max_size=40),
    st.sampled_from(["EUR", "USD", "eur", "", "XXX", str(uuid.uuid4())]),
)
JSON_KEYS = st.one_of(
    st.sampled_from([*TRANSFER_FIELDS, "opening_balance"]), st.text(TEXT_CHARS, max_size=12)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(JSON_KEYS, children, max_size=5)
    ),
    max_leaves=20,
)
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
IDEMPOTENT_ROUTES = st.sampled_from(["/v1/accounts", "/v1/transfers"])


def encode_json(value: Any, ascii_only: bool) -> bytes:
    # With ascii_only=False a lone surrogate becomes an invalid UTF-8 sequence on the wire.
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


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
    if route == "/v1/transfers":  # no byte string names two accounts of this tenant
        assert slug == "validation-error", show(response)


# -- 2. mutations of a valid transfer --------------------------------------------------------

UNKNOWN_FIELDS = st.one_of(
    st.sampled_from(["opening_balance", "id", "Amount", "source ", "memo\x00", ""]),
    st.text(TEXT_CHARS, max_size=12),
).filter(lambda k: k not in TRANSFER_FIELDS)
OTHER_TYPES = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(TEXT_CHARS, max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
AMOUNTS = st.one_of(
    st.integers(min_value=1, max_value=50),
    EDGE_NUMBERS,
    st.integers(),
    st.sampled_from(["10", "1e3", True, False, None, [], {}]),
)
CURRENCIES = st.one_of(
    st.sampled_from(["EUR", "USD", "GBP"]),
    st.sampled_from(["eur", "EURO", "", "XXX", "XTS", "EU", "EUR ", " EUR", "EUR\n", "€"]),
    st.sampled_from(sorted(ISO_4217)),
    st.from_regex(r"[A-Z]{3}", fullmatch=True),
    st.text(TEXT_CHARS, max_size=5),
    OTHER_TYPES,
)
MEMOS = st.one_of(
    st.none(),
    st.text(TEXT_CHARS, max_size=20),
    st.integers(MEMO_LIMIT - 2, MEMO_LIMIT + 2).map(lambda n: "m" * n),
    st.integers(MEMO_LIMIT - 2, MEMO_LIMIT + 2).map(lambda n: "\U0001f4a9" * n),
    OTHER_TYPES,
)


def account_refs(ledger: Ledger) -> st.SearchStrategy[Any]:
    mine = st.sampled_from([ledger.funded, ledger.empty, ledger.dollars])
    return st.one_of(
        mine,
        mine.map(str.upper),
        mine.map(lambda a: uuid.UUID(a).hex),
        st.sampled_from([ledger.foreign, str(uuid.uuid4())]),
        st.uuids().map(str),
        mine.map(lambda a: "{" + a + "}"),
        mine.map(lambda a: "urn:uuid:" + a),
        mine.map(lambda a: a[:-1]),
        st.sampled_from(["", "not-a-uuid", "0", "00000000-0000-0000-0000-000000000000"]),
        OTHER_TYPES,
    )


@st.composite
def transfer_bodies(draw: st.DrawFn, ledger: Ledger) -> dict[str, Any]:
    body: dict[str, Any] = {
        "source": ledger.funded,
        "destination": ledger.empty,
        "amount": draw(st.integers(1, 50) | st.integers(1, MAX_AMOUNT)),
        "currency": "EUR",
    }
    if draw(st.booleans()):
        body["memo"] = draw(MEMOS)
    values = {
        "source": account_refs(ledger),
        "destination": account_refs(ledger),
        "amount": AMOUNTS,
        "currency": CURRENCIES,
        "memo": MEMOS,
    }
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        action = draw(st.sampled_from(["drop", "unknown", "replace", "other-type", "swap"]))
        name = draw(st.sampled_from(TRANSFER_FIELDS))
        if action == "drop":
            body.pop(name, None)
        elif action == "unknown":
            extra = draw(UNKNOWN_FIELDS)
            body[extra] = draw(JSON_LEAVES)
        elif action == "replace":
            body[name] = draw(values[name])
        elif action == "other-type":
            body[name] = draw(OTHER_TYPES)
        elif "source" in body and "destination" in body:
            body["source"], body["destination"] = body["destination"], body["source"]
    return body


def parse_uuid(value: Any) -> uuid.UUID | None:
    """The two UUID spellings the body schema accepts: canonical and 32 hex digits."""
    if isinstance(value, str) and UUID_TEXT.fullmatch(value):
        return uuid.UUID(value)
    return None


def is_scalar_text(value: str) -> bool:
    """A string JSON can carry as Unicode scalar values (no lone surrogates)."""
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def is_storable_text(value: str) -> bool:
    """Text PostgreSQL can store: Unicode scalar values other than U+0000."""
    return is_scalar_text(value) and "\x00" not in value


def transfer_is_valid(body: dict[str, Any]) -> bool:
    """The body schema of POST /v1/transfers, written from the contract."""
    if not body.keys() >= REQUIRED_TRANSFER_FIELDS or not body.keys() <= set(TRANSFER_FIELDS):
        return False
    source, destination = parse_uuid(body["source"]), parse_uuid(body["destination"])
    amount, currency, memo = body["amount"], body["currency"], body.get("memo")
    return (
        source is not None
        and destination is not None
        and source != destination
        and type(amount) is int
        and 0 < amount <= MAX_AMOUNT
        and isinstance(currency, str)
        and currency in ISO_4217
        and (memo is None or (isinstance(memo, str) and len(memo) <= MEMO_LIMIT))
        and all(is_scalar_text(k) for k in body)
        and (memo is None or is_storable_text(memo))
    )


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
    body = data.draw(transfer_bodies(ledger), label="body")
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
        headers=[bearer(ledger.key), ("Idempotency-Key", uuid.uuid4().hex)],
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

# Bytes h11 puts on the wire in a header value (no NUL, CR, LF, VT, FF); trimmed of SP/HTAB.
HEADER_CHARS = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from('"\\ '),
    st.characters(min_codepoint=0x01, max_codepoint=0xFF, exclude_characters="\n\r\x0b\x0c"),
)
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
SF_PIECES = st.one_of(PRINTABLE, st.sampled_from(['\\"', "\\\\", "\\", '"', "\\n", "\t", "\xe9"]))
IDEMPOTENCY_KEYS = st.one_of(
    st.text(HEADER_CHARS, max_size=40),
    st.text(HEADER_CHARS, min_size=240, max_size=300),
    st.builds(lambda c, n: c * n, PRINTABLE, st.integers(min_value=250, max_value=260)),
    st.lists(SF_PIECES, max_size=30).map(lambda p: '"' + "".join(p) + '"'),
    st.builds(
        lambda p, n: '"' + "k" * n + "".join(p) + '"',
        st.lists(st.sampled_from(['\\"', "\\\\", "a"]), max_size=6),
        st.integers(min_value=248, max_value=256),
    ),
    st.lists(SF_PIECES, max_size=10).map(lambda p: '"' + "".join(p)),
)


def expected_key(raw: bytes) -> str | None:
    """The key a header value names (None: invalid), per the rule: an RFC 8941 sf-string
    (escapes only for quote and backslash) or the bare value; then 1-255 chars in 0x20-0x7E."""
    text = raw.decode("latin-1").strip(" \t")
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"'):
            return None
        inner, key, i = text[1:-1], [], 0
        while i < len(inner):
            if inner[i] == "\\":
                if inner[i + 1 : i + 2] not in ('"', "\\"):
                    return None
                key.append(inner[i + 1])
                i += 2
            elif inner[i] == '"':
                return None
            else:
                key.append(inner[i])
                i += 1
        text = "".join(key)
    if not 1 <= len(text) <= 255 or any(not 0x20 <= ord(c) <= 0x7E for c in text):
        return None
    return text


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
    key = expected_key(raw) if copies == 1 else None
    before = rows()

    response = http.post(
        "/v1/accounts",
        content=b'{"currency":"EUR"}',
        headers=[bearer(key_caller.key)] + [("Idempotency-Key", raw)] * copies,
    )

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
        assert response.headers.get("idempotent-replayed") == "false", show(response)
    elif target == "get-account":
        response = http.get(f"/v1/accounts/{ledger.funded}", headers=headers)
    else:
        response = http.get(f"/v1/operations/{ledger.operation_id}", headers=headers)

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
        headers=[bearer(ledger.key), ("Idempotency-Key", uuid.uuid4().hex)],
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
