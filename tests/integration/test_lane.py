"""The idempotent lane (service.http.lane) answers exactly as Litestar's router does: the same
requests through an app with the lane and one without, on the same database and Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlencode

import pytest
from litestar import Litestar

from service.config import Settings
from service.core import Scope
from service.http.app import create_app
from service.http.lane import IdempotentLane
from service.leases import LeaseManager
from service.store.db import make_engine
from service.store.principals import PrincipalStore, Role
from tests.conftest import Services

pytestmark = pytest.mark.integration

# headers whose values differ between two requests by design (ids, times)
VARYING = {b"request-id", b"operation-id", b"location", b"date"}


class _Asgi:
    """One app, driven over ASGI in this process, its lifespan started."""

    def __init__(self, app: Litestar) -> None:
        self.app = app
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._task = asyncio.create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        assert (await self._from_app.get())["type"] == "lifespan.startup.complete"

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await self._from_app.get()
        assert self._task is not None
        await self._task

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | list[tuple[str, str]],
        body: bytes | list[bytes] = b"",
        *,
        lower: bool = True,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``body``: one chunk, or the chunks of a streamed body (an empty list: the client
        hangs up instead); ``lower``: header names lowercased, as the ASGI servers send them."""
        pairs = headers.items() if isinstance(headers, dict) else headers
        raw = [((k.lower() if lower else k).encode(), v.encode("latin-1")) for k, v in pairs]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": raw,
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 80),
            "state": {},
        }
        chunks = [body] if isinstance(body, bytes) else list(body)
        hang_up = not chunks

        async def receive() -> dict[str, Any]:
            if chunks:
                chunk = chunks.pop(0)
                return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
            if not hang_up:
                await asyncio.sleep(30)
            return {"type": "http.disconnect"}

        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = sent[0]
        content = b"".join(m.get("body", b"") for m in sent[1:])
        return start["status"], list(start["headers"]), content


@pytest.fixture
async def apps(services: Services, migrated_url: str) -> AsyncIterator[tuple[_Asgi, _Asgi]]:
    settings = Settings.from_env(
        {}, database_url=migrated_url, redis_url=services.redis_url, sweep_interval=3600.0
    )
    lane, router = _Asgi(create_app(settings)), _Asgi(create_app(settings, lane=False))
    await lane.start()
    await router.start()
    yield lane, router
    await lane.stop()
    await router.stop()


@pytest.fixture
async def api_key(migrated_url: str) -> str:
    engine = make_engine(Settings.from_env({}), migrated_url, pool_size=1)
    try:
        tenant = f"lane-{uuid.uuid4().hex[:8]}"
        _, key = await PrincipalStore(engine).create(tenant, "lane-client", Role.CLIENT)
    finally:
        await engine.dispose()
    return key


def _same(
    one: tuple[int, list[tuple[bytes, bytes]], bytes],
    other: tuple[int, list[tuple[bytes, bytes]], bytes],
) -> None:
    assert one[0] == other[0]
    assert [k for k, _ in one[1]] == [k for k, _ in other[1]]
    assert [(k, v) for k, v in one[1] if k not in VARYING] == [
        (k, v) for k, v in other[1] if k not in VARYING
    ]
    if one[0] >= 400:  # problem documents name no ids but an operation's
        first, second = json.loads(one[2]), json.loads(other[2])
        first.pop("operation_id", None)
        second.pop("operation_id", None)
        assert first == second
    else:
        assert json.loads(one[2]).keys() == json.loads(other[2]).keys()


async def test_the_lane_answers_as_the_router_does(
    apps: tuple[_Asgi, _Asgi], api_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lane, router = apps
    served: list[str] = []
    handle = IdempotentLane._handle

    async def counted(self: IdempotentLane, handler: Any, scope: Any, *args: Any) -> None:
        served.append(scope["path"])
        await handle(self, handler, scope, *args)

    monkeypatch.setattr(IdempotentLane, "_handle", counted)
    auth = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    async def both(
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes | list[bytes] = b"",
        key: str | None = None,
        *,
        extra: tuple[tuple[str, str], ...] = (),
        lower: bool = True,
    ) -> tuple[Any, Any]:
        """The request through each app; ``key`` gets a per-app suffix (a new operation each);
        ``extra``: more headers, repeated names kept."""
        answers = []
        for app, suffix in ((lane, "lane"), (router, "router")):
            sent = list(headers.items())
            if key is not None:
                sent.append(("Idempotency-Key", f"{key}-{suffix}"))
            answers.append(await app.request(method, path, [*sent, *extra], body, lower=lower))
        _same(answers[0], answers[1])
        return answers[0], answers[1]

    funded = json.dumps({"currency": "EUR", "opening_balance": 100}).encode()
    opened, _ = await both("POST", "/v1/accounts", auth, funded, key="open")
    assert opened[0] == 201
    source = json.loads(opened[2])["id"]
    empty = json.dumps({"currency": "EUR"}).encode()
    second, _ = await both("POST", "/v1/accounts", auth, empty, key="open-2")
    destination = json.loads(second[2])["id"]

    def transfer_of(amount: int) -> bytes:
        fields = {"source": source, "destination": destination, "amount": amount}
        return json.dumps({**fields, "currency": "EUR"}).encode()

    transfer = transfer_of(1)

    # refusals before anything is stored
    await both("POST", "/v1/transfers", auth, transfer)  # no Idempotency-Key
    await both("POST", "/v1/transfers", {"Content-Type": "application/json"}, transfer, key="a")
    await both("POST", "/v1/transfers", {**auth, "Authorization": "Bearer nope"}, transfer, key="b")
    await both("POST", "/v1/transfers", auth, b"{not json", key="c")
    await both("POST", "/v1/transfers", {**auth, "Content-Type": "text/plain"}, transfer, key="d")
    big = {**auth, "Content-Length": str(10 * 1024 * 1024)}
    await both("POST", "/v1/transfers", big, b"", key="e")
    await both("POST", "/v1/transfers", auth, b"x" * (2 * 1024 * 1024), key="f")
    # answers of the use case: a transfer, its replay, a changed body, a refusal of the ledger
    first, _ = await both("POST", "/v1/transfers", auth, transfer, key="g")
    assert first[0] == 201
    replay, _ = await both("POST", "/v1/transfers", auth, transfer, key="g")
    assert (b"idempotent-replayed", b"true") in replay[1]
    changed, _ = await both("POST", "/v1/transfers", auth, transfer_of(2), key="g")
    assert changed[0] == 422
    refused, _ = await both("POST", "/v1/transfers", auth, transfer_of(1000), key="i")
    assert refused[0] == 402
    # what the lane reads of a request by itself: the body in chunks, within the limit or
    # not, a hang-up, a content-length that is no number, header names in any case,
    # repeated headers, Prefer
    third = len(transfer) // 3
    chunked = [transfer[:third], transfer[third : 2 * third], transfer[2 * third :]]
    streamed, _ = await both("POST", "/v1/transfers", auth, chunked, key="k")
    assert streamed[0] == 201
    over = [b"x" * (600 * 1024)] * 3
    assert (await both("POST", "/v1/transfers", auth, over, key="l"))[0][0] == 413
    await both("POST", "/v1/transfers", auth, [], key="m")
    await both("POST", "/v1/transfers", {**auth, "Content-Length": "twelve"}, transfer, key="n")
    cased, _ = await both("POST", "/v1/transfers", auth, transfer, key="o", lower=False)
    assert cased[0] == 201
    twice = (("Idempotency-Key", "one"), ("Idempotency-Key", "two"))
    assert (await both("POST", "/v1/transfers", auth, transfer, extra=twice))[0][0] == 400
    waited, _ = await both("POST", "/v1/transfers", {**auth, "Prefer": "wait=1"}, transfer, key="g")
    assert (b"idempotent-replayed", b"true") in waited[1]  # settled: a replay at once
    # payouts, off on this server: the route's own answer, through the lane too
    assert (await both("POST", "/v1/payouts", auth, b"{}", key="p"))[0][0] == 404
    # every POST above went through the lane of one app only
    assert len(served) == 21
    assert set(served) == {"/v1/accounts", "/v1/transfers", "/v1/payouts"}
    # what the lane leaves to Litestar
    await both("GET", "/v1/transfers", auth)
    await both("POST", "/v1/transfers/", auth, transfer, key="h")
    await both("POST", "/v1/transfers", {**auth, "Host": "bad host/"}, transfer, key="j")
    assert len(served) == 21


@pytest.fixture
async def client(migrated_url: str) -> tuple[Any, str]:
    """A client principal of its own tenant, with its API key."""
    engine = make_engine(Settings.from_env({}), migrated_url, pool_size=1)
    try:
        tenant = f"held-{uuid.uuid4().hex[:8]}"
        return await PrincipalStore(engine).create(tenant, "held-client", Role.CLIENT)
    finally:
        await engine.dispose()


@pytest.mark.parametrize("prefer", [None, "wait=2"])
async def test_a_held_lease_over_a_scope_with_no_row_answers_409_with_the_keys_lookup(
    apps: tuple[_Asgi, _Asgi],
    services: Services,
    connect_leases: Callable[..., LeaseManager],
    client: tuple[Any, str],
    prefer: str | None,
) -> None:
    """The lease is held (as while a new local operation's one statement runs) and the scope
    has no row: 409 at once, pointing at the key's lookup; with Prefer: wait too, since the
    scope is read once more and still has no row. Nothing is written."""
    principal, api_key = client
    route, key = "POST /v1/transfers", f"held-{uuid.uuid4().hex[:8]}"
    scope = Scope(
        tenant=principal.tenant, principal_id=principal.id, route=route, idempotency_key=key
    )
    leases = connect_leases(services.redis_url)
    held = await leases.acquire(scope.lease_name())
    assert held is not None
    try:
        headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Idempotency-Key": key,
        }
        if prefer is not None:
            headers["Prefer"] = prefer
        body = json.dumps(
            {"source": str(uuid.uuid4()), "destination": str(uuid.uuid4()), "amount": 1}
            | {"currency": "EUR"}
        ).encode()
        for app in apps:
            status, answered, content = await app.request("POST", "/v1/transfers", headers, body)
            found = dict(answered)
            assert status == 409, content
            assert json.loads(content)["type"] == "/problems/operation-in-progress"
            assert (
                found[b"location"]
                == b"/v1/operations?" + urlencode({"key": key, "route": route}).encode()
            )
            assert found[b"retry-after"] == b"1"
            assert b"preference-applied" not in found
    finally:
        assert await leases.release(held)
