"""The request rules of the HTTP contract, written here from docs/http.md rather than taken
from service/, and the Hypothesis strategies that probe them.

tests/unit/test_request_rules.py checks the service's own functions against these rules;
tests/e2e/test_fuzz.py checks that the server over HTTP gives the answers they name.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from service.domain.currencies import ISO_4217

MAX_AMOUNT = 10**15
MEMO_LIMIT = 512
MAX_KEY_LENGTH = 255
BENEFICIARY_LIMIT = 128
TRANSFER_FIELDS = ("source", "destination", "amount", "currency", "memo")
REQUIRED_TRANSFER_FIELDS = frozenset(TRANSFER_FIELDS[:4])
ACCOUNT_FIELDS = ("currency", "opening_balance")
PAYOUT_FIELDS = ("beneficiary", "amount", "currency")
UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32}"
)

# -- rules -----------------------------------------------------------------------------------


def expected_key(value: str) -> str | None:
    """The key one Idempotency-Key header value names (None: invalid): trimmed of SP/HTAB, an
    RFC 8941 sf-string (escapes only for quote and backslash) or the bare value; then
    1-255 characters in 0x20-0x7E."""
    text = value.strip(" \t")
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
    if not 1 <= len(text) <= MAX_KEY_LENGTH or any(not 0x20 <= ord(c) <= 0x7E for c in text):
        return None
    return text


def parse_uuid(value: Any) -> uuid.UUID | None:
    """The two UUID spellings the body schemas accept: canonical and 32 hex digits."""
    if isinstance(value, str) and UUID_TEXT.fullmatch(value):
        return uuid.UUID(value)
    return None


def is_scalar_text(value: str) -> bool:
    """A string JSON can carry as Unicode scalar values (no lone surrogates)."""
    return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def is_storable_text(value: str) -> bool:
    """Text PostgreSQL can store: Unicode scalar values other than U+0000."""
    return is_scalar_text(value) and "\x00" not in value


def _is_amount(value: Any, low: int) -> bool:
    """A JSON integer (not a bool, not a float) in low..MAX_AMOUNT."""
    return type(value) is int and low <= value <= MAX_AMOUNT


def _is_currency(value: Any) -> bool:
    return isinstance(value, str) and value in ISO_4217


def _has_fields(body: Any, required: Sequence[str], allowed: Sequence[str]) -> bool:
    return (
        isinstance(body, dict)
        and body.keys() >= set(required)
        and body.keys() <= set(allowed)
        and all(is_scalar_text(k) for k in body)
    )


def transfer_is_valid(body: Any) -> bool:
    """The body schema of POST /v1/transfers."""
    if not _has_fields(body, sorted(REQUIRED_TRANSFER_FIELDS), TRANSFER_FIELDS):
        return False
    source, destination = parse_uuid(body["source"]), parse_uuid(body["destination"])
    memo = body.get("memo")
    return (
        source is not None
        and destination is not None
        and source != destination
        and _is_amount(body["amount"], 1)
        and _is_currency(body["currency"])
        and (memo is None or (isinstance(memo, str) and len(memo) <= MEMO_LIMIT))
        and (memo is None or is_storable_text(memo))
    )


def account_is_valid(body: Any) -> bool:
    """The body schema of POST /v1/accounts: an opening balance may be 0, and is by default."""
    return (
        _has_fields(body, ["currency"], ACCOUNT_FIELDS)
        and _is_currency(body["currency"])
        and _is_amount(body.get("opening_balance", 0), 0)
    )


def is_beneficiary(value: Any) -> bool:
    """1-128 printable ASCII characters."""
    return (
        isinstance(value, str)
        and 1 <= len(value) <= BENEFICIARY_LIMIT
        and all(0x20 <= ord(c) <= 0x7E for c in value)
    )


def payout_is_valid(body: Any) -> bool:
    """The body schema of POST /v1/payouts: every field required."""
    return (
        _has_fields(body, PAYOUT_FIELDS, PAYOUT_FIELDS)
        and is_beneficiary(body["beneficiary"])
        and _is_amount(body["amount"], 1)
        and _is_currency(body["currency"])
    )


def encode_json(value: Any, ascii_only: bool) -> bytes:
    # With ascii_only=False a lone surrogate becomes an invalid UTF-8 sequence on the wire.
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


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
    st.sampled_from([*TRANSFER_FIELDS, *ACCOUNT_FIELDS, *PAYOUT_FIELDS]),
    st.text(TEXT_CHARS, max_size=12),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(JSON_KEYS, children, max_size=5)
    ),
    max_leaves=20,
)
OTHER_TYPES = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(TEXT_CHARS, max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
VALID_AMOUNTS = st.integers(1, 50) | st.integers(1, MAX_AMOUNT)
AMOUNTS = st.one_of(
    st.integers(min_value=1, max_value=50),
    EDGE_NUMBERS,
    st.integers(),
    st.sampled_from(["10", "1e3", True, False, None, [], {}]),
)
VALID_CURRENCIES = st.sampled_from(sorted(ISO_4217))
CURRENCIES = st.one_of(
    st.sampled_from(["EUR", "USD", "GBP"]),
    st.sampled_from(["eur", "EURO", "", "XXX", "XTS", "EU", "EUR ", " EUR", "EUR\n", "€"]),
    VALID_CURRENCIES,
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
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
VALID_BENEFICIARIES = st.text(PRINTABLE, min_size=1, max_size=BENEFICIARY_LIMIT)
BENEFICIARIES = st.one_of(
    VALID_BENEFICIARIES,
    st.integers(BENEFICIARY_LIMIT - 2, BENEFICIARY_LIMIT + 2).map(lambda n: "b" * n),
    st.sampled_from(["", " ", "ACME\t", "\nACME", "Caf\u00e9", "A\x00B", "A\x7fB"]),
    st.text(TEXT_CHARS, max_size=10),
    OTHER_TYPES,
)
UNKNOWN_FIELDS = st.one_of(
    st.sampled_from(["opening_balance", "id", "Amount", "source ", "memo\x00", ""]),
    st.text(TEXT_CHARS, max_size=12),
)


def account_refs(mine: Sequence[str], others: Sequence[str]) -> st.SearchStrategy[Any]:
    """References to accounts: the caller's own in every spelling, another tenant's or nobody's
    account, and text that is no account at all."""
    own = st.sampled_from(mine)
    return st.one_of(
        own,
        own.map(str.upper),
        own.map(lambda a: uuid.UUID(a).hex),
        st.sampled_from([*others, str(uuid.uuid4())]),
        st.uuids().map(str),
        own.map(lambda a: "{" + a + "}"),
        own.map(lambda a: "urn:uuid:" + a),
        own.map(lambda a: a[:-1]),
        st.sampled_from(["", "not-a-uuid", "0", "00000000-0000-0000-0000-000000000000"]),
        OTHER_TYPES,
    )


@st.composite
def mutated(
    draw: st.DrawFn,
    body: dict[str, Any],
    values: dict[str, st.SearchStrategy[Any]],
    swap: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """``body`` after up to three edits: a field dropped, an unknown field added, a field set to
    another value of its own kind or of another type, or (for ``swap``) two fields swapped."""
    body = dict(body)
    fields = sorted(values)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        action = draw(st.sampled_from(["drop", "unknown", "replace", "other-type", "swap"]))
        name = draw(st.sampled_from(fields))
        if action == "drop":
            body.pop(name, None)
        elif action == "unknown":
            extra = draw(UNKNOWN_FIELDS.filter(lambda k: k not in values))
            body[extra] = draw(JSON_LEAVES)
        elif action == "replace":
            body[name] = draw(values[name])
        elif action == "other-type":
            body[name] = draw(OTHER_TYPES)
        elif swap is not None and swap[0] in body and swap[1] in body:
            body[swap[0]], body[swap[1]] = body[swap[1]], body[swap[0]]
    return body


@st.composite
def transfer_bodies(draw: st.DrawFn, mine: Sequence[str], others: Sequence[str]) -> dict[str, Any]:
    """A valid transfer between the first two of ``mine``, then mutated."""
    body: dict[str, Any] = {
        "source": mine[0],
        "destination": mine[1],
        "amount": draw(VALID_AMOUNTS),
        "currency": "EUR",
    }
    if draw(st.booleans()):
        body["memo"] = draw(MEMOS)
    refs = account_refs(mine, others)
    values = {
        "source": refs,
        "destination": refs,
        "amount": AMOUNTS,
        "currency": CURRENCIES,
        "memo": MEMOS,
    }
    return draw(mutated(body, values, swap=("source", "destination")))


@st.composite
def account_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid account opening, then mutated."""
    body: dict[str, Any] = {"currency": draw(VALID_CURRENCIES)}
    if draw(st.booleans()):
        body["opening_balance"] = draw(st.just(0) | VALID_AMOUNTS)
    values = {"currency": CURRENCIES, "opening_balance": AMOUNTS | st.just(0)}
    return draw(mutated(body, values))


@st.composite
def payout_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid payout, then mutated."""
    body = {
        "beneficiary": draw(VALID_BENEFICIARIES),
        "amount": draw(VALID_AMOUNTS),
        "currency": draw(VALID_CURRENCIES),
    }
    values = {"beneficiary": BENEFICIARIES, "amount": AMOUNTS, "currency": CURRENCIES}
    return draw(mutated(body, values))


# Bytes h11 puts on the wire in a header value (no NUL, CR, LF, VT, FF); trimmed of SP/HTAB.
HEADER_CHARS = st.one_of(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from('"\\ '),
    st.characters(min_codepoint=0x01, max_codepoint=0xFF, exclude_characters="\n\r\x0b\x0c"),
)
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
"""Header values as a client can send them: Latin-1 text without line breaks."""
