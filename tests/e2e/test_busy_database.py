"""A busy database is a retryable answer, never a 500: a row held by another transaction past
the lock timeout, on the effect's path (an account) and on the admin's (the operation row)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest
import redis

from service.app.routes import TRANSFERS
from service.core.model import Scope
from service.leases.lease import DEFAULT_PREFIX
from service.store.pool import plain_dsn
from tests.conftest import Services
from tests.e2e.client import (
    ADMIN_KEY,
    auth,
    balance,
    in_effect,
    new_account,
    new_principal,
    scalar,
    transfer,
    until,
)
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


def slots_env(*, running: int, slot_wait: float, effect_sleep: float) -> dict[str, str]:
    """A server with ``running`` slots per principal, waited for ``slot_wait`` seconds (the
    connect timeout), whose effects each hold their slot ``effect_sleep`` seconds."""
    return {
        **ENV,
        "SETTLEMENT_MAX_RUNNING_PER_PRINCIPAL": str(running),
        "SETTLEMENT_DB_CONNECT_TIMEOUT": str(slot_wait),
        "SETTLEMENT_ENABLE_FAILPOINTS": "1",
        "SETTLEMENT_FAILPOINTS": f"effect.before_commit=sleep:{effect_sleep}",
    }


def account_pairs(server: ServerProcess, key: str, count: int) -> list[tuple[str, str]]:
    """``count`` (source with 100, destination with 0) pairs of the principal of ``key``."""
    return [
        (new_account(server.base_url, key, 100), new_account(server.base_url, key, 0))
        for _ in range(count)
    ]


def test_one_principal_cannot_take_every_connection(
    server: ServerProcess, services: Services, app_database: str
) -> None:
    slow = slots_env(running=2, slot_wait=0.3, effect_sleep=1.5)
    # the principals and their accounts from the module's server (no failpoint); an account
    # pair per request: they must not wait on each other's row locks
    greedy = new_principal(server.base_url)["api_key"]
    pairs = account_pairs(server, greedy, 3)
    other = new_principal(server.base_url)["api_key"]
    other_source = new_account(server.base_url, other, 100)
    other_destination = new_account(server.base_url, other, 0)
    with ServerProcess(app_database, services.redis_url, env=slow) as limited:
        answers: list[httpx.Response] = []

        def send(i: int) -> None:
            answers.append(transfer(limited.base_url, greedy, f"greedy-{i}", *pairs[i], 1))

        running = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for thread in running:
            thread.start()
        in_effect(app_database, 2)
        # the third waits for a slot up to the connect timeout (0.3 s here), then is refused
        refused = transfer(limited.base_url, greedy, "greedy-2", *pairs[2], 1)
        assert refused.status_code == 429, refused.text
        assert refused.json()["type"] == "/problems/too-many-requests"
        assert refused.headers["retry-after"]
        # another principal is not held back by the first one's requests
        fine = transfer(limited.base_url, other, "other-1", other_source, other_destination, 1)
        assert fine.status_code == 201, fine.text
        for thread in running:
            thread.join(30)
        assert sorted(a.status_code for a in answers) == [201, 201]
        # the refused key ran nothing: its retry executes it now
        retry = transfer(limited.base_url, greedy, "greedy-2", *pairs[2], 1)
        assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "false"
        assert [balance(limited.base_url, greedy, source) for source, _ in pairs] == [99, 99, 99]


def test_a_database_connection_lost_mid_request_is_a_503_and_the_retry_moves_money_once(
    services: Services, app_database: str
) -> None:
    """Found by the reliability suite: a PostgreSQL restart under load gave 500s. The server
    reaches the database through a relay; the relay is cut while a transfer waits for an
    account lock, so its connection dies mid-statement."""
    from sqlalchemy.engine import make_url

    from tests.reliability.relay import Relay

    port = make_url(app_database).port
    assert port is not None
    relay = Relay(port).start()
    env = {**ENV, "SETTLEMENT_DB_LOCK_TIMEOUT": "10"}
    try:
        with ServerProcess(relay.url_for(app_database, port), services.redis_url, env=env) as proc:
            key = new_principal(proc.base_url)["api_key"]
            source = new_account(proc.base_url, key, 100)
            destination = new_account(proc.base_url, key, 0)
            lock = "SELECT id FROM accounts WHERE id = $1 FOR UPDATE"
            with row_locked(app_database, lock, uuid.UUID(source)):
                cutter = threading.Timer(1.0, relay.cut)
                cutter.start()
                lost = transfer(proc.base_url, key, "cut-mid-request", source, destination, 10)
                cutter.join()
                assert lost.status_code == 503, lost.text
                assert lost.json()["type"] == "/problems/service-unavailable"
                assert lost.headers["retry-after"]
            relay.restore()
            deadline = time.monotonic() + 30
            while True:
                # the pool's dead connections are replaced on the way (503), and the row
                # left in_progress answers 409 until its lease runs out
                retry = transfer(proc.base_url, key, "cut-mid-request", source, destination, 10)
                if retry.status_code not in (409, 503) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert retry.status_code == 201, retry.text
            assert balance(proc.base_url, key, source) == 90
    finally:
        relay.stop()
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=source) == 1


def test_a_request_that_queued_past_its_lease_takes_it_anew_unless_a_duplicate_holds_it(
    server: ServerProcess, services: Services, app_database: str, request: pytest.FixtureRequest
) -> None:
    """One slot per principal, a lease of 1 s, and an effect that holds its slot for 2.5 s: a
    second request queues for the slot far past its lease. It takes the lease anew and runs
    (it used to answer 409 with nobody running); when a duplicate took the expired lease while
    both queued, exactly one of the two runs and the other is told 409 or replays it (which
    one depends on whose lease is live when each gets the slot)."""
    queued = {**slots_env(running=1, slot_wait=8, effect_sleep=2.5), "SETTLEMENT_LEASE_TTL": "1"}
    # the principal and its accounts from the module's server (no failpoint)
    principal = new_principal(server.base_url)
    key = principal["api_key"]
    pairs = account_pairs(server, key, 2)
    leases = redis.Redis.from_url(services.redis_url)
    request.addfinalizer(leases.close)

    def lease_of(idempotency_key: str) -> str:
        scope = Scope("acme", uuid.UUID(principal["id"]), TRANSFERS.route, idempotency_key)
        return DEFAULT_PREFIX + scope.lease_name()

    with ServerProcess(app_database, services.redis_url, env=queued) as slow:
        answers: dict[str, httpx.Response] = {}

        def send(name: str, idempotency_key: str, pair: int) -> threading.Thread:
            def post() -> None:
                answers[name] = transfer(slow.base_url, key, idempotency_key, *pairs[pair], 1)

            thread = threading.Thread(target=post)
            thread.start()
            return thread

        for round_, duplicate in (("alone", False), ("raced", True)):
            sent = [send(f"{round_}-holder", f"{round_}-holder", 0)]
            in_effect(app_database, 1)  # the holder runs its effect, in the one slot
            sent.append(send(f"{round_}-queued", f"{round_}-queued", 1))
            if duplicate:
                # the queued request took its 1 s lease, then it ran out while it queued
                lease = lease_of(f"{round_}-queued")
                until(lambda at=lease: leases.exists(at), "the queued request's lease")
                until(lambda at=lease: not leases.exists(at), "its lease ran out, unrenewed")
                sent.append(send(f"{round_}-duplicate", f"{round_}-queued", 1))
            for thread in sent:
                thread.join(40)
            assert answers[f"{round_}-holder"].status_code == 201
            ran = "SELECT count(*) FROM operations o JOIN transfers t ON t.operation_id = o.id"
            ran += " WHERE o.idempotency_key = :k"
            assert scalar(app_database, ran, k=f"{round_}-queued") == 1
            if not duplicate:
                alone = answers[f"{round_}-queued"]
                assert alone.status_code == 201, alone.text
                continue
            # one ran; the other found it held (409) or, queued until it was done, replayed it
            pair = [answers[f"{round_}-queued"], answers[f"{round_}-duplicate"]]
            ran_it = [
                a
                for a in pair
                if a.status_code == 201 and a.headers["idempotent-replayed"] == "false"
            ]
            assert len(ran_it) == 1, [a.text for a in pair]
            other = pair[1 - pair.index(ran_it[0])]
            if other.status_code == 409:
                assert other.json()["type"] == "/problems/operation-in-progress"
            else:
                assert other.status_code == 201, other.text
                assert other.headers["idempotent-replayed"] == "true"
                assert other.headers["operation-id"] == ran_it[0].headers["operation-id"]
