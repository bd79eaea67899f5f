"""A process started while PostgreSQL cannot be reached waits for it (SETTLEMENT_DB_START_WAIT)
instead of exiting at once, and exits with the error when the wait is over. PostgreSQL is
reached through a relay that refuses connections until it is restored."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from service.app.root import Settlement
from service.config import Settings
from service.store.db import DatabaseUnavailable
from tests.conftest import Services
from tests.reliability.relay import Relay

UNREACHABLE = "PostgreSQL is unreachable at start"
# Bounds of the waits below: generous, the test waits on what the process logs.
PROMPT = 20.0


@pytest.fixture
def relay(migrated_url: str) -> Iterator[tuple[Relay, str]]:
    """A relay in front of the test database, cut (every connection refused)."""
    port = urlsplit(migrated_url).port
    assert port is not None
    relay = Relay(port).start()
    relay.cut()
    try:
        yield relay, relay.url_for(migrated_url, port)
    finally:
        relay.stop()


class _Tries(logging.Handler):
    """Sets ``seen`` at the first "unreachable at start" line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = asyncio.Event()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(UNREACHABLE):
            self.count += 1
            self.seen.set()


@pytest.fixture
def tries() -> Iterator[_Tries]:
    handler = _Tries()
    logger = logging.getLogger("settlement.start")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def test_opened_while_postgres_is_away_it_waits_and_starts_when_it_is_back(
    services: Services, relay: tuple[Relay, str], tries: _Tries
) -> None:
    proxy, url = relay
    settings = Settings.from_env(
        {}, database_url=url, redis_url=services.redis_url, db_start_wait=60.0
    )
    opening = asyncio.create_task(Settlement.open(settings, background=False))
    await asyncio.wait_for(tries.seen.wait(), PROMPT)
    assert not opening.done()  # refused, and waiting: not exited
    proxy.restore()
    settlement = await asyncio.wait_for(opening, PROMPT)
    try:
        assert await settlement.principals.get(uuid.uuid4()) is None  # it reads the database
    finally:
        await settlement.close()


@pytest.mark.parametrize(
    ("wait", "tried"), [(0.3, True), (0.0, False)], ids=["past-its-wait", "no-wait"]
)
async def test_past_its_wait_or_with_none_it_gives_up_with_the_error(
    services: Services, relay: tuple[Relay, str], tries: _Tries, wait: float, tried: bool
) -> None:
    """Past ``SETTLEMENT_DB_START_WAIT`` it exits with the error, having tried again; with
    no wait it exits at once, without trying again."""
    _, url = relay
    settings = Settings.from_env(
        {}, database_url=url, redis_url=services.redis_url, db_start_wait=wait
    )
    with pytest.raises(DatabaseUnavailable):
        await asyncio.wait_for(Settlement.open(settings, background=False), PROMPT)
    assert (tries.count >= 1) is tried
