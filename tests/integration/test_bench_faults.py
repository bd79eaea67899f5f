"""The pieces of ``make bench-faults`` (``bench.faults``) that can be checked in seconds: the
relay cuts the share of answers it is given after the request reached the server, no request
is sent while a fault holds the load, the counting SQL finds a key whose money moved twice
(the server's key form and the peers' ``<key>/<operation id>``), and the tally calls an answer
lost exactly when the final retry's answer does not say what became of the request. The whole
bench is not run here."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import asyncpg
import pytest

from bench import fixtures
from bench.faults import copy_database
from bench.faults_count import ledger, tally, transfers_by_key
from bench.faults_load import send_pass
from bench.faults_relay import CuttingRelay
from bench.loadgen import raw_request
from bench.peer_app import route
from bench.stack import plain_url
from service.store.migrate import upgrade
from tests.conftest import Services, create_database

pytestmark = pytest.mark.integration

ANSWER = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


class Upstream:
    """A tiny HTTP/1.1 server: answers every request 201 and counts the requests it read."""

    def __init__(self) -> None:
        self.requests = 0
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Upstream]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(server.sockets[0].getsockname()[1])
        try:
            yield self
        finally:
            server.close()


def requests(port: int, n: int) -> list[tuple[str, bytes]]:
    return [
        (f"k-{i}", raw_request("POST", "/x", port, {"Idempotency-Key": f"k-{i}"}, b"{}"))
        for i in range(n)
    ]


async def test_the_relay_cuts_every_nth_answer_after_the_request_reached_the_server() -> None:
    async with Upstream().running() as upstream, CuttingRelay(upstream.port, 0.25) as relay:
        first = await send_pass(relay.port, requests(upstream.port, 20), connections=3)
    assert upstream.requests == 20  # every request ran, the cut ones too
    assert (relay.relayed, relay.cut) == (20, 5)
    assert sorted(first.statuses.values()) == [0] * 5 + [201] * 15
    assert first.in_flight_at_strike == -1


async def test_no_request_is_sent_while_a_fault_holds_the_load() -> None:
    seen: list[int] = []
    async with Upstream().running() as upstream:

        async def fault(hold: Callable[[], None]) -> None:
            await asyncio.sleep(0.05)  # the load goes on until the fault holds it
            hold()
            seen.append(upstream.requests)
            await asyncio.sleep(0.2)
            seen.append(upstream.requests)

        done = await send_pass(
            upstream.port, requests(upstream.port, 40), connections=4, strike_at=10, strike=fault
        )
    assert done.answered_at_strike == 10
    assert 0 <= done.in_flight_at_strike <= 4
    # held: the requests in flight reached the server, no new one was sent
    assert seen[0] <= seen[1] <= seen[0] + done.in_flight_at_strike
    assert list(done.statuses.values()) == [201] * 40
    assert upstream.requests == 40


_OPERATION = """
INSERT INTO operations (id, tenant, principal_id, route, idempotency_key, binding_generation,
       request_fingerprint, bound_principal_id, bound_credential_generation, state, revision,
       fencing_token)
VALUES ($1, $2, $3, $4, $5, 1, $6, $3, 1, 'unknown', 1, 1)
"""
_TRANSFER = """
INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id, destination_id,
       amount, currency, created_at)
VALUES ($1, $2, $3, 1, $4, $5, 1, $6, now())
"""
_MOVE = "UPDATE accounts SET balance = balance + $2 WHERE id = $1"


async def _transfer(
    conn: asyncpg.Connection, principal: uuid.UUID, operations_route: str, key: str
) -> None:
    """One transfer of 1 from pair 1 with its operation row (key as the rows hold it)."""
    operation = uuid.uuid4()
    source, destination = fixtures.pair(1)
    await conn.execute(
        _OPERATION, operation, fixtures.TENANT, principal, operations_route, key, "0" * 64
    )
    await conn.execute(
        _TRANSFER,
        uuid.uuid4(),
        fixtures.TENANT,
        operation,
        source,
        destination,
        fixtures.CURRENCY,
    )
    await conn.execute(_MOVE, source, -1)
    await conn.execute(_MOVE, destination, 1)


async def test_the_counting_sql_finds_a_key_whose_money_moved_twice(services: Services) -> None:
    template = plain_url(await create_database(services, "faults_template"))
    await asyncio.to_thread(upgrade, template)
    url = await copy_database(template, f"faults_{uuid.uuid4().hex[:10]}")  # as each run does
    fixture = await fixtures.create(url)
    principal = uuid.UUID(fixture.principal_id)
    peer = route("powertools")
    conn = await asyncpg.connect(url)
    try:
        await _transfer(conn, principal, fixtures.ROUTE, "ours-1")
        await _transfer(conn, principal, peer, f"twice/{uuid.uuid4()}")
        await _transfer(conn, principal, peer, f"twice/{uuid.uuid4()}")
        await _transfer(conn, principal, peer, f"once/{uuid.uuid4()}")
    finally:
        await conn.close()

    assert await transfers_by_key(url, fixtures.ROUTE) == {"ours-1": 1}
    made = await transfers_by_key(url, peer)
    assert made == {"twice": 2, "once": 1}
    money = await ledger(url)
    assert (money.left_sources, money.reached_destinations, money.transferred) == (4, 4, 4)
    assert money.agrees

    figures = tally(
        ["twice", "once", "never"],
        first={"twice": 201, "once": 0, "never": 0},
        retry={"twice": 201, "once": 409, "never": 0},
        transfers=made,
    )
    assert (figures.keys_sent, figures.transfers_made, figures.keys_moved) == (3, 3, 2)
    assert (figures.keys_moved_twice, figures.extra_transfers) == (1, 1)
    assert (figures.answers_lost, figures.lost_with_transfer) == (2, 1)
    assert figures.lost_without_transfer == 1
    assert figures.first_no_answer == 2
    assert figures.retry_statuses == {"none": 1, "201": 1, "409": 1}


def test_an_answer_is_lost_unless_it_says_what_became_of_the_request() -> None:
    keys = ["ok", "refused", "in-progress", "unavailable", "none", "too-many"]
    retry = {
        "ok": 201,
        "refused": 402,
        "in-progress": 409,
        "unavailable": 503,
        "none": 0,
        "too-many": 429,
    }
    figures = tally(keys, first=retry, retry=retry, transfers={"ok": 1})
    assert figures.answers_lost == figures.lost_at_retry == 4
    assert (figures.first_5xx, figures.retry_5xx) == (1, 1)
    assert figures.told_but_not_moved == 0
    assert tally(["k"], first={}, retry={"k": 200}, transfers={}).told_but_not_moved == 1


def test_the_late_retry_decides_what_the_retry_left_open() -> None:
    figures = tally(
        ["replayed", "stuck", "failing"],
        first={"replayed": 0, "stuck": 0, "failing": 0},
        retry={"replayed": 409, "stuck": 409, "failing": 500},
        transfers={"replayed": 1, "failing": 1},
        late={"replayed": 201, "stuck": 409, "failing": 500},
    )
    assert figures.lost_at_retry == 3
    assert (figures.answers_lost, figures.lost_with_transfer) == (2, 1)
    assert figures.retry_5xx == 2  # the retry's 500 and the late retry's
    assert figures.late_statuses == {"201": 1, "409": 1, "500": 1}
