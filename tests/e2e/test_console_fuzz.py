"""The console's new inputs fuzzed: the work list's search (``key`` with ``tenant`` and
``after``), the Accept form of a conflicting identity, and the revoke confirmation's path.
Whatever is sent, the answer is a page or a refusal, never a 5xx, and nothing is written
(row counts of every table)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.client import ADMIN_KEY, count_rows
from tests.e2e.console import form_token, signed_in_client
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# what an operator or a crafted link may put in a query string or a form field
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)
_SEARCH = st.one_of(
    _TEXT,
    st.uuids().map(str),
    st.text("abcdef0123456789-", min_size=30, max_size=40),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), min_size=250, max_size=260),
)
_FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def console(server: ServerProcess) -> Iterator[httpx.Client]:
    with signed_in_client(server.base_url, ADMIN_KEY) as client:
        yield client


@_FUZZ
@given(key=_SEARCH, tenant=st.one_of(st.none(), _TEXT), after=st.one_of(st.none(), _TEXT))
def test_no_search_is_a_server_error(
    console: httpx.Client, app_database: str, key: str, tenant: str | None, after: str | None
) -> None:
    before = count_rows(app_database)
    params = {"key": key, "tenant": tenant, "after": after}
    answer = console.get("/console", params={k: v for k, v in params.items() if v is not None})
    assert answer.status_code in (200, 303, 400, 403, 404), (params, answer.text[:500])
    assert count_rows(app_database) == before


@_FUZZ
@given(feed=_TEXT.filter(lambda s: "/" not in s and s not in ("", ".", "..")), event_id=_TEXT)
def test_no_accept_form_is_a_server_error(
    console: httpx.Client, app_database: str, feed: str, event_id: str
) -> None:
    before = count_rows(app_database)
    token = form_token(console.get("/console").text)
    answer = console.post(
        f"/console/feeds/{quote(feed, safe='')}/conflicts",
        data={"csrf": token, "event_id": event_id, "action": "accept"},
    )
    assert answer.status_code in (303, 400, 403, 404, 405), (feed, event_id, answer.text[:500])
    assert count_rows(app_database) == before


@_FUZZ
@given(action=_TEXT.filter(lambda s: "/" not in s and s not in ("", ".", "..")))
def test_no_revoke_confirmation_path_is_a_server_error(console: httpx.Client, action: str) -> None:
    path = f"/console/principals/{uuid.uuid4()}/{quote(action, safe='')}"
    answer = console.get(path)
    assert answer.status_code in (400, 404, 405), (action, answer.text[:500])
