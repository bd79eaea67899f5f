"""Cursor tokens of the simulator's cursor feed and the feeds' query parameters, as pure
functions: a token is deterministic, opaque and refused when forged; both variants of a
position decode to it; bad parameters are refused."""

from __future__ import annotations

import base64
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devstack.provider.cursors import MAX_POSITION, CursorCodec, CursorError, Variant
from devstack.provider.feeds import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    FeedError,
    parse_after,
    parse_cursor,
    parse_limit,
)

SECRET = "unit-feed-secret"
CODEC = CursorCodec(SECRET)
POSITIONS = [10 * n for n in range(1, 201)]
URLSAFE = set(string.ascii_letters + string.digits + "-_")


@given(st.integers(min_value=0, max_value=MAX_POSITION), st.sampled_from(list(Variant)))
def test_a_token_decodes_to_its_position_and_variant(position: int, variant: Variant) -> None:
    token = CODEC.encode(position, variant)

    assert CODEC.decode(token) == (position, variant)
    assert CursorCodec(SECRET).encode(position, variant) == token  # deterministic


def test_the_empty_cursor_is_the_start() -> None:
    assert CODEC.decode("") == (0, Variant.SERVED)


def test_tokens_are_opaque_not_numbers_and_not_in_position_order() -> None:
    tokens = [CODEC.encode(position) for position in POSITIONS]

    for position, token in zip(POSITIONS, tokens, strict=True):
        assert len(token) == 19 and set(token) <= URLSAFE, token
        assert str(position) not in token
        with pytest.raises(ValueError):
            float(token)
    assert len(set(tokens)) == len(tokens)
    assert sorted(tokens) != tokens  # string order says nothing about position order


def test_the_two_variants_of_a_position_differ_and_decode_to_it() -> None:
    served, advance = CODEC.encode(40, Variant.SERVED), CODEC.encode(40, Variant.ADVANCE)

    assert served != advance
    assert CODEC.decode(served) == (40, Variant.SERVED)
    assert CODEC.decode(advance) == (40, Variant.ADVANCE)
    assert Variant.SERVED.other is Variant.ADVANCE and Variant.ADVANCE.other is Variant.SERVED


def test_a_token_with_any_character_changed_is_refused() -> None:
    token = CODEC.encode(1230)
    for index, char in enumerate(token):
        for other in ("A", "z", "0", "_"):
            if other == char:
                continue
            forged = token[:index] + other + token[index + 1 :]
            with pytest.raises(CursorError):
                CODEC.decode(forged)


@pytest.mark.parametrize(
    "token",
    [
        "0",
        "10",
        "-1",
        "1e3",
        "not a cursor",
        "A" * 18,
        "A" * 20,
        "A" * 19,
        CODEC.encode(10) + "=",
        CODEC.encode(10)[:-1] + "+",
        CursorCodec("another secret").encode(10),
        CursorCodec("another secret").encode(0),
    ],
)
def test_malformed_or_foreign_cursors_are_refused(token: str) -> None:
    with pytest.raises(CursorError):
        CODEC.decode(token)


def test_a_non_canonical_encoding_of_a_token_is_refused() -> None:
    token = CODEC.encode(10)
    raw = base64.urlsafe_b64decode(token + "=")
    # 14 bytes leave 2 unused low bits in the last character: set them
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"
    last = alphabet.index(token[-1])
    twisted = token[:-1] + alphabet[last | 1]
    assert base64.urlsafe_b64decode(twisted + "=") == raw
    assert twisted != token

    with pytest.raises(CursorError):
        CODEC.decode(twisted)


def test_a_position_out_of_range_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        CODEC.encode(-1)
    with pytest.raises(ValueError):
        CODEC.encode(MAX_POSITION + 1)


@pytest.mark.parametrize(
    ("values", "limit"), [([], DEFAULT_LIMIT), (["1"], 1), (["500"], MAX_LIMIT), (["007"], 7)]
)
def test_limit_takes_1_to_500(values: list[str], limit: int) -> None:
    assert parse_limit(values) == limit


@pytest.mark.parametrize(
    "values", [["0"], ["501"], ["-1"], ["1.5"], ["ten"], [""], ["1e2"], ["١٢"], ["1", "2"]]
)
def test_limit_outside_1_to_500_is_refused(values: list[str]) -> None:
    with pytest.raises(FeedError):
        parse_limit(values)


def test_after_is_absent_or_whole_seconds() -> None:
    assert parse_after([]) is None
    assert parse_after(["0"]) == 0
    assert parse_after(["1700000000"]) == 1_700_000_000
    for bad in (["-1"], ["1.5"], [""], ["soon"], ["1" * 13], ["1", "2"]):
        with pytest.raises(FeedError):
            parse_after(bad)


def test_cursor_is_given_at_most_once_and_short() -> None:
    assert parse_cursor([]) == ""
    assert parse_cursor(["abc"]) == "abc"
    for bad in (["a", "b"], ["A" * 65]):
        with pytest.raises(FeedError):
            parse_cursor(bad)
