"""Helpers for end-to-end tests: principals, accounts and transfers over real HTTP, and
direct reads of the tables (to assert what was, and was not, written)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from service.store.db import async_url
from service.store.principals import new_key
from tests.conftest import run

T = TypeVar("T")

ADMIN_KEY = new_key()  # the bootstrap key must be an API key of 128 random bits
# Longest wait for a state another process reaches (a settlement, an observer's page).
PATIENCE = 30.0


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def new_principal(base_url: str, tenant: str = "acme", role: str = "client") -> dict[str, Any]:
    response = httpx.post(
        f"{base_url}/admin/v1/principals",
        json={"tenant": tenant, "name": f"{role}-{uuid.uuid4().hex[:8]}", "role": role},
        headers=auth(ADMIN_KEY),
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def new_account(base_url: str, key: str, balance: int, currency: str = "EUR") -> str:
    response = httpx.post(
        f"{base_url}/v1/accounts",
        json={"currency": currency, "opening_balance": balance},
        headers={**auth(key), "Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def transfer(
    base_url: str,
    key: str,
    idempotency_key: str,
    source: str,
    destination: str,
    amount: int,
    *,
    timeout: float = 30.0,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return httpx.post(
        f"{base_url}/v1/transfers",
        json={"source": source, "destination": destination, "amount": amount, "currency": "EUR"},
        headers={**auth(key), "Idempotency-Key": idempotency_key, **(headers or {})},
        timeout=timeout,
    )


def balance(base_url: str, key: str, account: str) -> int:
    response = httpx.get(f"{base_url}/v1/accounts/{account}", headers=auth(key))
    assert response.status_code == 200, response.text
    return int(response.json()["balance"])


async def _on_database(database_url: str, query: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Run ``query`` on one connection of a throw-away engine (end-to-end tests are sync)."""
    engine = create_async_engine(async_url(database_url))
    try:
        async with engine.connect() as conn:
            return await query(conn)
    finally:
        await engine.dispose()


def scalar(database_url: str, sql: str, **params: Any) -> Any:
    async def query(conn: AsyncConnection) -> Any:
        return (await conn.execute(text(sql), params)).scalar_one()

    return run(_on_database(database_url, query))


def execute(database_url: str, sql: str, **params: Any) -> None:
    """One statement in a transaction of its own, committed."""
    engine = create_async_engine(async_url(database_url))

    async def go() -> None:
        try:
            async with engine.begin() as conn:
                await conn.execute(text(sql), params)
        finally:
            await engine.dispose()

    run(go())


def count_rows(database_url: str) -> dict[str, int]:
    """Row counts of every table: 'nothing written' is asserted as 'no count changed'."""
    from service.app.routes import SCHEMA as metadata

    async def query(conn: AsyncConnection) -> dict[str, int]:
        return {
            name: int((await conn.execute(select(func.count()).select_from(t))).scalar_one())
            for name, t in metadata.tables.items()
        }

    return run(_on_database(database_url, query))


def until(check: Callable[[], Any], what: str, timeout: float = PATIENCE) -> Any:
    """Poll ``check`` (observable state) until it answers something true, and return that;
    fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.1)


def in_effect(database_url: str, count: int) -> None:
    """Until ``count`` requests hold a transaction open inside their effect (a failpoint's
    sleep or crash point before its commit), as ``pg_stat_activity`` shows them."""
    open_ = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state = 'idle in transaction'"
    )
    until(lambda: scalar(database_url, open_) >= count, f"{count} requests inside their effect")
