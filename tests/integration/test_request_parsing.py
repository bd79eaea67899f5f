"""What the routes read of a request beyond their bodies: Accept (weights and wildcards) on
the problem pages, and query parameters a route does not declare (refused, not ignored)."""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlencode

import pytest

from service.config import Settings
from service.domain.principals import Role
from service.store.db import make_engine
from service.store.principals import PrincipalStore
from tests.integration.asgi import Asgi

pytestmark = pytest.mark.integration


@pytest.fixture
async def keys(migrated_url: str) -> dict[str, str]:
    engine = make_engine(Settings.from_env({}), migrated_url, pool_size=1)
    try:
        tenant = f"parse-{uuid.uuid4().hex[:8]}"
        store = PrincipalStore(engine)
        _, admin = await store.create(tenant, "parse-admin", Role.ADMIN)
        _, client = await store.create(tenant, "parse-client", Role.CLIENT)
    finally:
        await engine.dispose()
    return {"admin": admin, "client": client}


@pytest.mark.parametrize(
    ("accept", "media_type"),
    [
        (None, "text/html"),
        ("*/*", "text/html"),
        ("application/json", "application/json"),
        ("application/json;q=0.9, text/html;q=0.5", "application/json"),
        ("text/html;q=0.4, application/json", "application/json"),
        ("application/*", "application/json"),
        ("text/html, application/json", "text/html"),
        ("image/png", "text/html"),
    ],
)
async def test_a_problem_page_follows_accept(
    app: Asgi, accept: str | None, media_type: str
) -> None:
    headers = {} if accept is None else {"Accept": accept}
    status, sent, body = await app.request("GET", "/problems/fingerprint-mismatch", headers)
    assert status == 200
    assert dict(sent)[b"content-type"].decode().startswith(media_type)
    if media_type == "application/json":
        assert json.loads(body)["slug"] == "fingerprint-mismatch"


@pytest.mark.parametrize(
    ("path", "query", "who"),
    [
        ("/admin/v1/operations", {"state": "unknown", "cursor": "!!notbase64!!"}, "admin"),
        ("/v1/operations", {"key": "k", "cursor": "x"}, "client"),
    ],
)
async def test_a_query_parameter_the_route_does_not_take_is_a_400(
    app: Asgi, keys: dict[str, str], path: str, query: dict[str, str], who: str
) -> None:
    auth = {"Authorization": f"Bearer {keys[who]}"}
    status, _, body = await app.request("GET", f"{path}?{urlencode(query)}", auth)
    assert status == 400, body
    problem = json.loads(body)
    assert problem["type"] == "/problems/validation-error"
    assert "'cursor'" in problem["detail"]
    # credentials are still judged first
    status, _, body = await app.request("GET", f"{path}?{urlencode(query)}", {})
    assert status == 401, body


async def test_a_malformed_work_list_cursor_is_a_400(app: Asgi, keys: dict[str, str]) -> None:
    auth = {"Authorization": f"Bearer {keys['admin']}"}
    for after in ("!!notbase64!!", "Zm9v", ""):
        query = urlencode({"state": "unknown", "after": after})
        status, _, body = await app.request("GET", f"/admin/v1/operations?{query}", auth)
        assert status == 400, (after, body)
        assert json.loads(body)["type"] == "/problems/validation-error"
