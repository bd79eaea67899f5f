"""The idempotent routes through Litestar's router, in process: every refusal before the use
case (credentials, the key, the body: decoded strictly, within the limit, streamed or not),
the use case's answers, and the idempotency headers on each."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import pytest

from service.config import Settings
from service.core import Scope
from service.domain.principals import Role
from service.leases import LeaseManager
from service.store.db import make_engine
from service.store.principals import PrincipalStore
from tests.conftest import Services
from tests.integration.asgi import Asgi

pytestmark = pytest.mark.integration

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


@pytest.fixture
async def client(migrated_url: str) -> tuple[Any, str]:
    """A client principal of its own tenant, with its API key."""
    engine = make_engine(Settings.from_env({}), migrated_url, pool_size=1)
    try:
        tenant = f"routes-{uuid.uuid4().hex[:8]}"
        return await PrincipalStore(engine).create(tenant, "routes-client", Role.CLIENT)
    finally:
        await engine.dispose()


def _slug(answer: Answer) -> str:
    found: str = json.loads(answer[2])["type"].removeprefix("/problems/")
    return found


def _header(answer: Answer, name: bytes) -> bytes | None:
    return dict(answer[1]).get(name)


async def test_every_answer_of_an_idempotent_route(app: Asgi, client: tuple[Any, str]) -> None:
    _, api_key = client
    auth = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}

    async def post(
        path: str,
        headers: dict[str, str],
        body: bytes | list[bytes] = b"",
        key: str | None = None,
        *,
        extra: tuple[tuple[str, str], ...] = (),
        lower: bool = True,
    ) -> Answer:
        sent = list(headers.items())
        if key is not None:
            sent.append(("Idempotency-Key", key))
        return await app.request("POST", path, [*sent, *extra], body, lower=lower)

    def refused(answer: Answer, status: int, slug: str) -> None:
        assert answer[0] == status, answer
        assert _slug(answer) == slug
        assert _header(answer, b"content-type") == b"application/problem+json"
        assert _header(answer, b"idempotent-replayed") == b"false"
        assert _header(answer, b"operation-id") is None

    funded = json.dumps({"currency": "EUR", "opening_balance": 100}).encode()
    opened = await post("/v1/accounts", auth, funded, key="open")
    assert opened[0] == 201
    source = json.loads(opened[2])["id"]
    empty = json.dumps({"currency": "EUR"}).encode()
    destination = json.loads((await post("/v1/accounts", auth, empty, key="open-2"))[2])["id"]

    def transfer_of(amount: Any) -> bytes:
        fields = {"source": source, "destination": destination, "amount": amount}
        return json.dumps({**fields, "currency": "EUR"}).encode()

    transfer = transfer_of(1)

    # refusals before anything is stored, in the order a client fixes them
    refused(await post("/v1/transfers", auth, transfer), 400, "idempotency-key-missing")
    no_auth = {"Content-Type": "application/json"}
    refused(await post("/v1/transfers", no_auth, b"{not json"), 401, "unauthenticated")
    bad_key = {**auth, "Authorization": "Bearer nope"}
    refused(await post("/v1/transfers", bad_key, transfer, key="b"), 401, "unauthenticated")
    refused(await post("/v1/transfers", auth, b"{not json", key="c"), 400, "validation-error")
    refused(await post("/v1/transfers", auth, b"", key="c2"), 400, "validation-error")
    # strict: no coercion of "1" to 1
    refused(await post("/v1/transfers", auth, transfer_of("1"), key="c3"), 400, "validation-error")
    text = {**auth, "Content-Type": "text/plain"}
    refused(await post("/v1/transfers", text, transfer, key="d"), 415, "unsupported-media-type")
    big = {**auth, "Content-Length": str(10 * 1024 * 1024)}
    refused(await post("/v1/transfers", big, b"", key="e"), 413, "payload-too-large")
    huge = b"x" * (2 * 1024 * 1024)
    refused(await post("/v1/transfers", auth, huge, key="f"), 413, "payload-too-large")
    over = [b"x" * (600 * 1024)] * 3
    refused(await post("/v1/transfers", auth, over, key="l"), 413, "payload-too-large")
    twice = (("Idempotency-Key", "one"), ("Idempotency-Key", "two"))
    refused(
        await post("/v1/transfers", auth, transfer, extra=twice), 400, "idempotency-key-invalid"
    )
    # the use case's answers: a transfer, its replay, a changed body, a refusal of the ledger
    first = await post("/v1/transfers", auth, transfer, key="g")
    assert first[0] == 201
    assert _header(first, b"idempotent-replayed") == b"false"
    operation = _header(first, b"operation-id")
    assert operation is not None
    replay = await post("/v1/transfers", auth, transfer, key="g")
    assert (replay[0], replay[2]) == (first[0], first[2])
    assert _header(replay, b"idempotent-replayed") == b"true"
    assert _header(replay, b"operation-id") == operation
    changed = await post("/v1/transfers", auth, transfer_of(2), key="g")
    assert (changed[0], _slug(changed)) == (422, "fingerprint-mismatch")
    refusal = await post("/v1/transfers", auth, transfer_of(1000), key="i")
    assert (refusal[0], _slug(refusal)) == (402, "insufficient-funds")
    # the body in chunks, header names in any case, Prefer on a settled operation
    third = len(transfer) // 3
    chunked = [transfer[:third], transfer[third : 2 * third], transfer[2 * third :]]
    assert (await post("/v1/transfers", auth, chunked, key="k"))[0] == 201
    assert (await post("/v1/transfers", auth, transfer, key="o", lower=False))[0] == 201
    waited = await post("/v1/transfers", {**auth, "Prefer": "wait=1"}, transfer, key="g")
    assert _header(waited, b"idempotent-replayed") == b"true"  # settled: a replay at once
    # a content-length that is no number, and a hang-up while the body is read
    nan = {**auth, "Content-Length": "twelve"}
    assert (await post("/v1/transfers", nan, transfer, key="n"))[0] == 400
    gone = await post("/v1/transfers", auth, [], key="m")
    assert gone[0] == 400
    # payouts, off on this server: 404 for a well-formed request of a caller who may pay out
    refused(await post("/v1/payouts", auth, b"{}", key="p"), 404, "not-found")
    refused(await post("/v1/payouts", no_auth, b"{}", key="p"), 401, "unauthenticated")
    refused(await post("/v1/payouts", auth, b"{}"), 400, "idempotency-key-missing")
    # nothing of the refusals was stored: their keys are new
    for key in ("b", "c", "c2", "c3", "d", "e", "f", "l", "m", "n"):
        found = await app.request(
            "GET",
            "/v1/operations?" + urlencode({"key": key, "route": "POST /v1/transfers"}),
            {"Authorization": f"Bearer {api_key}"},
        )
        assert found[0] == 404, (key, found)


@pytest.mark.parametrize("prefer", [None, "wait=2"])
async def test_a_held_lease_over_a_scope_with_no_row_answers_409_with_the_keys_lookup(
    services: Services,
    migrated_url: str,
    connect_leases: Callable[..., LeaseManager],
    client: tuple[Any, str],
    prefer: str | None,
) -> None:
    """The lease is held (as while a payout's attempt claims its row; a new local operation's
    one statement takes none) and the scope has no row: 409 at once, pointing at the key's
    lookup; with Prefer: wait too, since the scope is read once more and still has no row.
    Nothing is written."""
    from service.http.app import create_app

    settings = Settings.from_env(
        {},
        database_url=migrated_url,
        redis_url=services.redis_url,
        sweep_interval=3600.0,
        # payouts on; the provider is never called (the lease is held)
        provider_url="http://127.0.0.1:9",
        provider_secret="s" * 32,
    )
    app = Asgi(create_app(settings))
    await app.start()
    principal, api_key = client
    route, key = "POST /v1/payouts", f"held-{uuid.uuid4().hex[:8]}"
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
        body = json.dumps({"beneficiary": "ann", "amount": 1, "currency": "EUR"}).encode()
        status, answered, content = await app.request("POST", "/v1/payouts", headers, body)
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
        await app.stop()
        assert await leases.release(held)
