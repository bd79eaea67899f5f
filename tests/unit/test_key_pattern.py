"""The OpenAPI document's Idempotency-Key pattern admits exactly the values the server's
parser accepts (service.http.keys), bare and quoted, so a generated client can tell."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from service.http.idempotent_doc import KEY_PATTERN, MAX_KEY_HEADER
from service.http.keys import IdempotencyKeyError, parse_idempotency_key

PATTERN = re.compile(KEY_PATTERN)
# printable ASCII and tab, quotes and backslashes more often than chance gives them
CHARS = st.sampled_from([chr(c) for c in range(0x20, 0x7F)] + ['"', "\\", '"', "\\", "\t"])


def accepted(value: str) -> bool:
    try:
        parse_idempotency_key([value])
    except IdempotencyKeyError:
        return False
    return True


@given(
    st.one_of(
        st.text(CHARS, min_size=0, max_size=300),
        st.text(CHARS, min_size=0, max_size=300).map(lambda s: f'"{s}"'),
        st.integers(250, 260).map(lambda n: "k" * n),
        st.integers(250, 260).map(lambda n: '"' + "k" * n + '"'),
    )
)
@example('"a\\"b"')
@example('"a"b"')
@example('"x\\y"')
@example('"' + '\\"' * 255 + '"')
def test_the_pattern_admits_what_the_server_accepts(value: str) -> None:
    if value != value.strip(" \t"):
        return  # the server strips surrounding blanks; the document asks for none
    assert bool(PATTERN.match(value)) == accepted(value), value
    if accepted(value):
        assert len(value) <= MAX_KEY_HEADER
