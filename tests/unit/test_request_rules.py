"""The request rules of the idempotent routes as properties of the functions that apply them:
Idempotency-Key parsing, the body schemas, and the request fingerprint (docs/http.md "Idempotent
routes", steps 1 and 2). The rules themselves are written in tests/contract.py."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from devstack.provider.payments import PaymentRequest, paid_fingerprint
from service.app.fingerprint import fingerprint
from service.app.routes import PAYOUTS as PAYOUT_SPEC
from service.domain.ledger import AccountRequest, TransferRequest
from service.domain.payouts import PAYOUT_ROUTE, PayoutRequest, payout_fingerprint
from service.http.keys import IdempotencyKeyError, parse_idempotency_key
from tests.contract import (
    HEADER_CHARS,
    IDEMPOTENCY_KEYS,
    JSON_VALUES,
    MAX_KEY_LENGTH,
    TEXT_CHARS,
    VALID_AMOUNTS,
    VALID_BENEFICIARIES,
    VALID_CURRENCIES,
    account_bodies,
    account_is_valid,
    encode_json,
    expected_key,
    payout_bodies,
    payout_is_valid,
    transfer_bodies,
    transfer_is_valid,
)

RULES = settings(max_examples=300, deadline=None)

# Three accounts of the caller and one of another tenant: any UUIDs do for the schema.
MINE = [str(uuid.uuid4()) for _ in range(3)]
OTHERS = [str(uuid.uuid4())]


class Route:
    def __init__(
        self,
        name: str,
        body_type: type[msgspec.Struct],
        is_valid: Callable[[Any], bool],
        bodies: st.SearchStrategy[dict[str, Any]],
    ) -> None:
        self.name = name
        self.body_type = body_type
        self.is_valid = is_valid
        self.bodies = bodies

    def __repr__(self) -> str:
        return self.name

    def decode(self, content: bytes) -> msgspec.Struct:
        return msgspec.json.decode(content, type=self.body_type)

    def fingerprint(self, content: bytes, path: dict[str, Any] | None = None) -> str:
        return fingerprint(self.name, path or {}, self.decode(content))


TRANSFERS = Route(
    "POST /v1/transfers", TransferRequest, transfer_is_valid, transfer_bodies(MINE, OTHERS)
)
ACCOUNTS = Route("POST /v1/accounts", AccountRequest, account_is_valid, account_bodies())
PAYOUTS = Route("POST /v1/payouts", PayoutRequest, payout_is_valid, payout_bodies())
ROUTES = st.sampled_from([TRANSFERS, ACCOUNTS, PAYOUTS])


def decodes(route: Route, content: bytes) -> bool:
    """Whether the route's schema takes the body; a refusal is only ever a msgspec error."""
    try:
        route.decode(content)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False
    return True


# -- Idempotency-Key -------------------------------------------------------------------------


@RULES
@given(value=IDEMPOTENCY_KEYS | st.text())
@example('""')
@example('"abc')
@example('"a\\nb"')
@example('"a\\"b\\\\c"')
@example(" \tk-1\t ")
@example("k" * MAX_KEY_LENGTH)
@example("k" * (MAX_KEY_LENGTH + 1))
@example('"' + "k" * MAX_KEY_LENGTH + '"')
def test_idempotency_key_is_parsed_by_the_rule(value: str) -> None:
    key = expected_key(value)
    event("valid key" if key is not None else "invalid key")
    if key is None:
        with pytest.raises(IdempotencyKeyError) as refused:
            parse_idempotency_key([value])
        assert refused.value.slug == "idempotency-key-invalid"
    else:
        assert parse_idempotency_key([value]) == key


@given(values=st.lists(st.text(HEADER_CHARS, max_size=20), min_size=2, max_size=4))
def test_more_than_one_idempotency_key_header_is_invalid(values: list[str]) -> None:
    with pytest.raises(IdempotencyKeyError) as refused:
        parse_idempotency_key(values)
    assert refused.value.slug == "idempotency-key-invalid"


def test_a_missing_idempotency_key_is_its_own_problem() -> None:
    with pytest.raises(IdempotencyKeyError) as refused:
        parse_idempotency_key([])
    assert refused.value.slug == "idempotency-key-missing"


# -- body schemas ----------------------------------------------------------------------------


@RULES
@given(route=ROUTES, data=st.data(), ascii_only=st.booleans())
def test_a_body_is_taken_exactly_when_its_schema_allows(
    route: Route, data: st.DataObject, ascii_only: bool
) -> None:
    body = data.draw(route.bodies, label="body")
    valid = route.is_valid(body)
    event(f"{route}: {'valid' if valid else 'refused'}")
    content = encode_json(body, ascii_only)
    assert decodes(route, content) == valid
    if valid:  # and what it takes is exactly what was sent, defaults filled in
        sent = {**DEFAULTS[route], **body}
        for name in ("source", "destination"):
            if name in sent:
                sent[name] = uuid.UUID(sent[name])
        assert msgspec.structs.asdict(route.decode(content)) == sent


@RULES
@given(route=ROUTES, value=JSON_VALUES, ascii_only=st.booleans())
def test_arbitrary_json_is_accepted_only_when_the_schema_allows(
    route: Route, value: Any, ascii_only: bool
) -> None:
    valid = route.is_valid(value)
    event(f"{route}: {'valid' if valid else 'refused'}")
    assert decodes(route, encode_json(value, ascii_only)) == valid


@RULES
@given(route=ROUTES, content=st.binary(max_size=2048))
def test_arbitrary_bytes_are_refused_unless_they_spell_a_valid_body(
    route: Route, content: bytes
) -> None:
    if decodes(route, content):
        assert route.is_valid(json.loads(content))


def test_a_memo_with_nul_is_refused() -> None:
    """PostgreSQL text cannot hold U+0000: the schema refuses it before any statement."""
    body = {"source": MINE[0], "destination": MINE[1], "amount": 1, "currency": "EUR"}
    assert decodes(TRANSFERS, encode_json({**body, "memo": "ab"}, ascii_only=True))
    assert not decodes(TRANSFERS, encode_json({**body, "memo": "a\x00b"}, ascii_only=True))


def test_a_beneficiary_with_a_trailing_newline_is_refused() -> None:
    body = {"beneficiary": "ACME\n", "amount": 1, "currency": "EUR"}
    assert not payout_is_valid(body)
    assert not decodes(PAYOUTS, encode_json(body, ascii_only=True))


# -- the request fingerprint -----------------------------------------------------------------

DEFAULTS = {TRANSFERS: {"memo": None}, ACCOUNTS: {"opening_balance": 0}, PAYOUTS: {}}
WHITESPACE = st.text(st.sampled_from(" \t\r\n"), max_size=3)


@st.composite
def valid_bodies(draw: st.DrawFn, route: Route) -> dict[str, Any]:
    if route is TRANSFERS:
        source, destination = draw(st.permutations(MINE))[:2]
        body: dict[str, Any] = {
            "source": source,
            "destination": destination,
            "amount": draw(VALID_AMOUNTS),
            "currency": draw(VALID_CURRENCIES),
            "memo": draw(st.none() | st.text(TEXT_CHARS, max_size=20).filter(transfer_memo)),
        }
    elif route is ACCOUNTS:
        body = {
            "currency": draw(VALID_CURRENCIES),
            "opening_balance": draw(st.just(0) | VALID_AMOUNTS),
        }
    else:
        body = {
            "beneficiary": draw(VALID_BENEFICIARIES),
            "amount": draw(VALID_AMOUNTS),
            "currency": draw(VALID_CURRENCIES),
        }
    assert route.is_valid(body)
    return body


def transfer_memo(memo: str) -> bool:
    return transfer_is_valid(
        {"source": MINE[0], "destination": MINE[1], "amount": 1, "currency": "EUR", "memo": memo}
    )


@st.composite
def spellings(draw: st.DrawFn, route: Route, body: dict[str, Any]) -> bytes:
    """Another text of the same request: keys in any order, any whitespace between tokens,
    defaults left out or spelled out, UUIDs in either accepted spelling and any case, and
    non-ASCII text raw or escaped."""
    fields = dict(body)
    for name, default in DEFAULTS[route].items():
        if fields.get(name) == default and draw(st.booleans()):
            del fields[name]
    for name in ("source", "destination"):
        if name in fields:
            spelled = uuid.UUID(fields[name])
            fields[name] = draw(
                st.sampled_from(
                    [str(spelled), spelled.hex, str(spelled).upper(), spelled.hex.upper()]
                )
            )
    ascii_only = draw(st.booleans())
    items = draw(st.permutations(sorted(fields.items())))
    members = [
        draw(WHITESPACE)
        + json.dumps(name)
        + draw(WHITESPACE)
        + ":"
        + draw(WHITESPACE)
        + json.dumps(value, ensure_ascii=ascii_only)
        + draw(WHITESPACE)
        for name, value in items
    ]
    text = draw(WHITESPACE) + "{" + ",".join(members) + draw(WHITESPACE) + "}" + draw(WHITESPACE)
    return text.encode()


@RULES
@given(route=ROUTES, data=st.data())
def test_the_fingerprint_ignores_key_order_whitespace_and_spelled_out_defaults(
    route: Route, data: st.DataObject
) -> None:
    body = data.draw(valid_bodies(route), label="body")
    first = data.draw(spellings(route, body), label="first")
    second = data.draw(spellings(route, body), label="second")
    assert route.fingerprint(first) == route.fingerprint(second)


@RULES
@given(route=ROUTES, data=st.data())
def test_the_fingerprint_changes_with_any_value(route: Route, data: st.DataObject) -> None:
    body = data.draw(valid_bodies(route), label="body")
    other = data.draw(valid_bodies(route), label="other")
    name = data.draw(st.sampled_from(sorted(body)), label="field")
    changed = {**body, name: other[name]}
    if route is TRANSFERS and changed["source"] == changed["destination"]:
        changed["source"], changed["destination"] = body["destination"], body["source"]
    same = route.decode(encode_json(body, True)) == route.decode(encode_json(changed, True))
    assert same == (changed == body)
    assert (
        route.fingerprint(encode_json(body, True)) == route.fingerprint(encode_json(changed, True))
    ) == same


@RULES
@given(route=ROUTES, data=st.data(), path=st.dictionaries(st.text(max_size=5), st.text(max_size=8)))
def test_the_fingerprint_is_sha256_of_the_sorted_route_path_and_filled_in_body(
    route: Route, data: st.DataObject, path: dict[str, str]
) -> None:
    body = data.draw(valid_bodies(route), label="body")
    canonical = json.dumps(
        {"route": route.name, "path": path, "body": {**DEFAULTS[route], **body}},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    expected = hashlib.sha256(canonical.encode()).hexdigest()
    assert route.fingerprint(encode_json(body, True), path) == expected
    other_route = "POST /v1/other"
    assert fingerprint(other_route, path, route.decode(encode_json(body, True))) != expected
    assert (
        route.fingerprint(encode_json(body, True), {**path, "id": "x" + path.get("id", "")})
        != expected
    )


@RULES
@given(data=st.data())
def test_the_provider_recomputes_a_payouts_fingerprint_as_the_server_computes_it(
    data: st.DataObject,
) -> None:
    """The simulator pays only the fingerprint of what it pays: its function must give the
    server's fingerprint for every payout the server takes."""
    body = data.draw(valid_bodies(PAYOUTS), label="body")
    server = PAYOUTS.fingerprint(encode_json(body, True))
    payment = msgspec.convert(
        {
            "operation_id": str(uuid.uuid4()),
            "binding_generation": 1,
            "request_fingerprint": server,
            **body,
        },
        type=PaymentRequest,
    )

    assert PAYOUT_SPEC.route == PAYOUT_ROUTE == PAYOUTS.name
    assert payout_fingerprint(PAYOUTS.decode(encode_json(body, True))) == server  # type: ignore[arg-type]
    assert paid_fingerprint(payment) == server
