"""A busy database is a retryable answer, never a 500: a row held by another transaction past
the lock timeout, on the effect's path (an account) and on the admin's (the operation row)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from service.store.pool import plain_dsn
from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, balance, new_account, new_principal, scalar, transfer
from tests.e2e.server import ServerProcess

ENV = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_DB_LOCK_TIMEOUT": "0.5"}


@pytest.fixture(scope="module")
def server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    with ServerProcess(app_database, services.redis_url, env=ENV) as proc:
        yield proc


@contextlib.contextmanager
def row_locked(database_url: str, sql: str, *args: Any) -> Iterator[None]:
    """Another transaction holds the rows ``sql`` (a SELECT ... FOR UPDATE) locks, until the
    block ends."""
    locked, release = threading.Event(), threading.Event()

    async def hold() -> None:
        conn = await asyncpg.connect(plain_dsn(database_url))
        try:
            async with conn.transaction():
                await conn.fetch(sql, *args)
                locked.set()
                await asyncio.to_thread(release.wait, 30)
        finally:
            await conn.close()

    holder = threading.Thread(target=lambda: asyncio.run(hold()), daemon=True)
    holder.start()
    assert locked.wait(10), "the lock was not taken"
    try:
        yield
    finally:
        release.set()
        holder.join(10)


def test_a_locked_account_is_a_503_with_retry_after_and_the_retry_moves_money_once(
    server: ServerProcess, app_database: str
) -> None:
    key = new_principal(server.base_url)["api_key"]
    source = new_account(server.base_url, key, 100)
    destination = new_account(server.base_url, key, 0)
    lock = "SELECT id FROM accounts WHERE id = $1 FOR UPDATE"
    with row_locked(app_database, lock, uuid.UUID(source)):
        busy = transfer(server.base_url, key, "busy-account", source, destination, 10)
        assert busy.status_code == 503, busy.text
        assert busy.json()["type"] == "/problems/service-unavailable"
        assert busy.headers["retry-after"]
        assert busy.json()["state"] == "unknown"
    retry = transfer(server.base_url, key, "busy-account", source, destination, 10)
    assert retry.status_code == 201, retry.text
    assert balance(server.base_url, key, source) == 90
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=source) == 1


def test_a_supersede_of_a_locked_operation_row_is_a_409_with_retry_after(
    server: ServerProcess, app_database: str
) -> None:
    key = new_principal(server.base_url)["api_key"]
    source = new_account(server.base_url, key, 100)
    destination = new_account(server.base_url, key, 0)
    done = transfer(server.base_url, key, "busy-row", source, destination, 10)
    operation_id = done.headers["operation-id"]
    lock = "SELECT id FROM operations WHERE id = $1 FOR UPDATE"
    with row_locked(app_database, lock, uuid.UUID(operation_id)):
        answer = httpx.post(
            f"{server.base_url}/admin/v1/operations/{operation_id}/supersede",
            json={"reason": "x", "force": True},
            headers=auth(ADMIN_KEY),
            timeout=30,
        )
    assert answer.status_code == 409, answer.text
    assert answer.json()["type"] == "/problems/operation-in-progress"
    assert answer.headers["retry-after"]
    assert balance(server.base_url, key, source) == 90
