"""Transfers racing near the balance limit over HTTP, against a real server, PostgreSQL and
Redis; and what a client gets when a database constraint refuses an effect's writes.

The races are deterministic: a credit of the source account is written and held open in a
transaction of the test's own; the transfers are sent at once and the test waits until every
one of them waits for that row's lock (``pg_stat_activity``); then the credit commits. Every
transfer's statement began before the credit and is judged after it: the interleaving that
answered 500 (a CHECK violation of the balance) before the transfer's writes were computed
from the rows its guard locked.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import (
    ADMIN_KEY,
    auth,
    balance,
    count_rows,
    execute,
    new_account,
    new_principal,
    scalar,
)
from tests.e2e.server import ServerProcess
from tests.locks import lock_waiters

pytestmark = pytest.mark.e2e

# How long a transfer may wait behind the held row (the server's hot lock timeout here), and
# the test for the transfers to queue there: far above what queuing takes (milliseconds).
QUEUE_WAIT = 20.0
# A memo the test's own constraint refuses (test_a_constraint_that_refuses_...).
REFUSED_MEMO = "refused by a test constraint"


@pytest.fixture(scope="module")
def server(services: Services, app_database: str) -> Iterator[ServerProcess]:
    """The server, its account locks waited for as long as the barrier holds them."""
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_DB_LOCK_TIMEOUT": str(QUEUE_WAIT),
        "SETTLEMENT_DB_STATEMENT_TIMEOUT": str(2 * QUEUE_WAIT),
    }
    with ServerProcess(app_database, services.redis_url, env=env) as proc:
        yield proc


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def _race(
    server: ServerProcess, app_database: str, *, opening: int, credit: int, amount: int, n: int
) -> tuple[str, str, list[httpx.Response]]:
    """``n`` transfers of ``amount`` out of an account opened with ``opening``, to ``n``
    accounts, all sent while a credit of ``credit`` to it is held, which then commits."""
    base = server.base_url
    key = new_principal(base)["api_key"]
    source = new_account(base, key, opening)
    destinations = [new_account(base, key, 0) for _ in range(n)]
    holder = await asyncpg.connect(_plain(app_database))
    try:
        async with httpx.AsyncClient(base_url=base, timeout=2 * QUEUE_WAIT) as http:
            async with holder.transaction():
                await holder.execute(
                    "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
                    credit,
                    uuid.UUID(source),
                )
                sent = [
                    asyncio.ensure_future(
                        http.post(
                            "/v1/transfers",
                            json={
                                "source": source,
                                "destination": destination,
                                "amount": amount,
                                "currency": "EUR",
                            },
                            headers={**auth(key), "Idempotency-Key": f"race-{i}"},
                        )
                    )
                    for i, destination in enumerate(destinations)
                ]
                await lock_waiters(holder, n, patience=QUEUE_WAIT)
            answers = list(await asyncio.gather(*sent))
    finally:
        await holder.close()
    return key, source, answers


async def test_transfers_a_concurrent_credit_funded_while_they_waited_all_answer_201(
    server: ServerProcess, app_database: str
) -> None:
    """Credit then debit: the account held 0 when the transfers' statements began; the
    credit that committed while they waited covers all five. Before the fix: 500s."""
    key, source, answers = await _race(server, app_database, opening=0, credit=500, amount=100, n=5)
    assert [a.status_code for a in answers] == [201] * 5, [a.text for a in answers]
    assert balance(server.base_url, key, source) == 0


async def test_transfers_beyond_the_balance_answer_201_as_far_as_it_goes_then_402(
    server: ServerProcess, app_database: str
) -> None:
    """The account held 50 when the statements began; the credit of 250 that committed
    while they waited makes 300: exactly three of five transfers of 100 go through, two
    answer 402 judged on the balance left (0), and the balance never goes below 0."""
    key, source, answers = await _race(
        server, app_database, opening=50, credit=250, amount=100, n=5
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201, 201, 201, 402, 402], [a.text for a in answers]
    for refused in (a for a in answers if a.status_code == 402):
        assert refused.json()["type"] == "/problems/insufficient-funds"
        assert "source balance 0 is below the amount 100" in refused.json()["detail"]
    assert balance(server.base_url, key, source) == 0
    reader = await asyncpg.connect(_plain(app_database))
    try:
        moved = await reader.fetchval(
            "SELECT count(*) FROM transfers WHERE source_id = $1", uuid.UUID(source)
        )
    finally:
        await reader.close()
    assert moved == 3


def _transfer(
    base: str, key: str, idempotency_key: str, source: str, destination: str, amount: int
) -> httpx.Response:
    body = {
        "source": source,
        "destination": destination,
        "amount": amount,
        "currency": "EUR",
        "memo": REFUSED_MEMO,
    }
    return httpx.post(
        f"{base}/v1/transfers",
        json=body,
        headers={**auth(key), "Idempotency-Key": idempotency_key},
        timeout=30,
    )


def test_a_constraint_that_refuses_an_effects_writes_answers_409_and_writes_nothing(
    server: ServerProcess, app_database: str
) -> None:
    """The safety net: a database integrity error raised by an effect is never a 500. Here
    a constraint of the test's own refuses the transfer's row: first in the one statement of
    a new operation (no row is left), then after a claim (the row is left unknown); each
    time 409 effect-refused, nothing written, and a retry with the same key runs it once the
    constraint is gone."""
    base = server.base_url
    key = new_principal(base)["api_key"]
    source, destination = new_account(base, key, 100), new_account(base, key, 0)
    execute(
        app_database,
        "ALTER TABLE transfers ADD CONSTRAINT ck_test_refused_memo"
        f" CHECK (memo IS DISTINCT FROM '{REFUSED_MEMO}')",
    )
    try:
        before = count_rows(app_database)
        new = _transfer(base, key, "refused-new", source, destination, 30)
        assert new.status_code == 409, new.text
        assert new.headers["content-type"] == "application/problem+json"
        assert new.json()["type"] == "/problems/effect-refused"
        assert "ck_test_refused_memo" in new.json()["detail"]
        assert new.headers["retry-after"]
        assert count_rows(app_database) == before  # the one statement wrote nothing

        # an operation with a row: refused for funds (402, stored), superseded (unknown),
        # then run again after a claim, where the constraint refuses it
        claimed = _transfer(base, key, "refused-claimed", source, destination, 1000)
        assert claimed.status_code == 402, claimed.text
        operation_id = claimed.headers["operation-id"]
        superseded = httpx.post(
            f"{base}/admin/v1/operations/{operation_id}/supersede",
            json={"reason": "test: run it again"},
            headers=auth(ADMIN_KEY),
        )
        assert superseded.status_code == 200, superseded.text
        execute(
            app_database, "UPDATE accounts SET balance = 1100 WHERE id = :s", s=uuid.UUID(source)
        )
        again = _transfer(base, key, "refused-claimed", source, destination, 1000)
        assert again.status_code == 409, again.text
        assert again.json()["type"] == "/problems/effect-refused"
        assert again.json()["state"] == "unknown"
        assert balance(base, key, source) == 1100
        state = scalar(
            app_database,
            "SELECT state FROM operations WHERE id = :o",
            o=uuid.UUID(operation_id),
        )
        assert state == "unknown"
    finally:
        execute(app_database, "ALTER TABLE transfers DROP CONSTRAINT ck_test_refused_memo")

    # the constraint gone, the same retries run the transfers, each once
    assert _transfer(base, key, "refused-claimed", source, destination, 1000).status_code == 201
    assert _transfer(base, key, "refused-new", source, destination, 30).status_code == 201
    assert _transfer(base, key, "refused-new", source, destination, 30).status_code == 201
    assert balance(base, key, source) == 70
    assert balance(base, key, destination) == 1030
