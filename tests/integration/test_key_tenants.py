"""The request's first read is given the key's tenant (docs/scaling.md, "The hot path"): a
process remembers the tenant of each key it found live (``service.store.principals.KeyTenants``),
and every request still asks ``principals`` whether its key is live. Counted in statements
sent, through asyncpg's query logger on the pooled connections: a remembered key's request
sends what it sent before the tenant was pinned (a replay one statement, a new transfer two),
a key's first request in a process one more, and a wrong key one, remembered by nobody."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import Pool

from service.domain.principals import Role
from service.store.hot import HotPath
from service.store.principals import KeyTenants, PrincipalStore, hash_key
from tests.citus_statements import hot_statements
from tests.integration.asgi import Asgi

pytestmark = pytest.mark.integration

ROUTE = "POST /v1/transfers"


@contextmanager
def sent() -> Iterator[list[str]]:
    """The hot statements sent meanwhile on any pooled connection, in order, each named as
    the routing test names them (``hot_sql.IDENTIFY``): the background loops' statements and
    a new connection's set-up are not the request's."""
    texts: list[str] = []
    drivers: list[Any] = []

    def logged(record: Any) -> None:
        texts.append(record.query)

    def cursor(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        texts.append(statement)

    def checkout(dbapi_connection: Any, *rest: Any) -> None:
        driver = getattr(dbapi_connection, "driver_connection", None)
        if driver is not None and hasattr(driver, "add_query_logger"):
            driver.add_query_logger(logged)
            drivers.append(driver)

    names = {sql: name for name, sql in hot_statements().items()}
    named: list[str] = []
    event.listen(Engine, "before_cursor_execute", cursor)
    event.listen(Pool, "checkout", checkout)
    try:
        yield named
    finally:
        event.remove(Engine, "before_cursor_execute", cursor)
        event.remove(Pool, "checkout", checkout)
        for driver in drivers:
            driver.remove_query_logger(logged)
        named.extend(names[text] for text in texts if text in names)


async def _client(engine: AsyncEngine) -> tuple[PrincipalStore, uuid.UUID, str]:
    """A client of a tenant of its own: (the store, its id, its API key)."""
    principals = PrincipalStore(engine)
    tenant = f"keys-{uuid.uuid4().hex[:8]}"
    principal, key = await principals.create(tenant, "client", Role.CLIENT)
    return principals, principal.id, key


async def _settle_loggers() -> None:
    for _ in range(3):  # asyncpg calls its loggers soon after the statement
        await asyncio.sleep(0)


async def posted(
    app: Asgi, key: str, path: str, body: dict[str, Any], idem: str
) -> tuple[int, Any, list[str]]:
    """POST ``body`` to ``path`` with ``key`` and the Idempotency-Key ``idem``: the status,
    the decoded answer and the hot statements sent meanwhile (:func:`sent`)."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Idempotency-Key": idem,
    }
    with sent() as statements:
        status, _, raw = await app.request("POST", path, headers, json.dumps(body).encode())
        await _settle_loggers()
    return status, json.loads(raw), statements


async def open_accounts(
    app: Asgi, key: str, balances: tuple[int, ...]
) -> tuple[list[str], list[list[str]]]:
    """Open an EUR account per balance with ``key``: their ids, and the hot statements each
    request sent."""
    opened, said = [], []
    for n, balance in enumerate(balances):
        body = {"currency": "EUR", "opening_balance": balance}
        status, account, statements = await posted(app, key, "/v1/accounts", body, f"open-{n}")
        assert status == 201, account
        opened.append(account["id"])
        said.append(statements)
    return opened, said


async def test_a_revoked_key_is_refused_at_once_though_its_tenant_is_remembered(
    engine: AsyncEngine, pool: Any
) -> None:
    principals, principal_id, key = await _client(engine)
    tenants = KeyTenants()
    hot = HotPath(pool, tenants)
    digest = hash_key(key)
    with sent() as first:
        found = await hot.identify(digest, ROUTE, "k", _now())
        await _settle_loggers()
    assert found is not None and found[0].id == principal_id
    assert first == ["hot_sql.TENANT_OF", "hot_sql.IDENTIFY"]
    assert tenants.get(digest) == found[0].tenant

    assert await principals.revoke(principal_id) is not None
    with sent() as refused:
        assert await hot.identify(digest, ROUTE, "k", _now()) is None
        await _settle_loggers()
    assert refused == ["hot_sql.IDENTIFY"]  # given the tenant remembered, and still refused
    assert tenants.get(digest) is None and len(tenants) == 0  # forgotten
    with sent() as again:
        assert await hot.identify(digest, ROUTE, "k", _now()) is None
        await _settle_loggers()
    assert again == ["hot_sql.TENANT_OF"]


async def test_a_rotated_key_works_and_the_old_one_is_refused(
    engine: AsyncEngine, pool: Any
) -> None:
    principals, principal_id, old = await _client(engine)
    tenants = KeyTenants()
    hot = HotPath(pool, tenants)
    assert await hot.identify(hash_key(old), ROUTE, "k", _now()) is not None
    rotated = await principals.rotate(principal_id)
    assert rotated is not None
    _, new = rotated
    found = await hot.identify(hash_key(new), ROUTE, "k", _now())
    assert found is not None
    assert (found[0].id, found[0].credential_generation) == (principal_id, 2)
    assert await hot.identify(hash_key(old), ROUTE, "k", _now()) is None
    assert len(tenants) == 1 and tenants.get(hash_key(new)) == found[0].tenant


async def test_a_wrong_key_costs_one_read_and_is_not_remembered(pool: Any) -> None:
    tenants = KeyTenants()
    hot = HotPath(pool, tenants)
    for n in range(3):
        with sent() as statements:
            assert await hot.identify(bytes([n]) * 32, ROUTE, "k", _now()) is None
            await _settle_loggers()
        assert statements == ["hot_sql.TENANT_OF"]
    assert len(tenants) == 0


def test_the_tenants_kept_are_bounded_the_least_recently_used_forgotten_first() -> None:
    tenants = KeyTenants(2)
    tenants.remember(b"a", "t1")
    tenants.remember(b"b", "t2")
    assert tenants.get(b"a") == "t1"  # used: b is now the least recently used
    tenants.remember(b"c", "t3")
    assert (tenants.get(b"a"), tenants.get(b"b"), tenants.get(b"c"), len(tenants)) == (
        "t1",
        None,
        "t3",
        2,
    )
    none = KeyTenants(0)
    none.remember(b"a", "t1")
    assert len(none) == 0 and none.get(b"a") is None


async def test_a_remembered_keys_replay_is_one_statement_and_a_new_transfer_two(
    app: Asgi, engine: AsyncEngine
) -> None:
    _, _, key = await _client(engine)

    async def post(path: str, body: dict[str, Any], idem: str) -> tuple[int, Any, list[str]]:
        return await posted(app, key, path, body, idem)

    opened, said = await open_accounts(app, key, (100, 0))
    remembered = ["hot_sql.IDENTIFY", "claim_settle_with(open-account)"]
    # the key's first request in this process finds its tenant first
    assert said == [["hot_sql.TENANT_OF", *remembered], remembered]
    transfer = {"source": opened[0], "destination": opened[1], "amount": 10, "currency": "EUR"}
    status, made, statements = await post("/v1/transfers", transfer, "transfer")
    assert status == 201, made
    assert statements == ["hot_sql.IDENTIFY", "claim_settle_with(transfer)"]
    status, replayed, statements = await post("/v1/transfers", transfer, "transfer")
    assert (status, replayed) == (201, made)
    assert statements == ["hot_sql.IDENTIFY"]


def _now() -> datetime:
    return datetime.now(UTC)
