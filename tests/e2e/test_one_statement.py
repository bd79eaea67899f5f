"""A new local operation is claimed, run and settled in one statement and takes no lease
(docs/design.md §2 rule 2): concurrent duplicates of a new transfer make one transfer, and
every other answer is a replay of it (no 409), with Redis up and with Redis down."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from devstack import EmbeddedRedis
from tests.e2e.client import ADMIN_KEY, balance, new_account, new_principal, scalar, transfer
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# duplicates of one new transfer sent at once, and the threads that send them
DUPLICATES = 16


def _duplicates(
    server: ServerProcess, key: str, source: str, destination: str
) -> list[httpx.Response]:
    idem = f"dup-{uuid.uuid4().hex}"
    with ThreadPoolExecutor(max_workers=DUPLICATES) as pool:
        return list(
            pool.map(
                lambda _: transfer(server.base_url, key, idem, source, destination, 7),
                range(DUPLICATES),
            )
        )


def _one_transfer_and_its_replays(
    answers: list[httpx.Response], database: str, source: str
) -> None:
    assert [a.status_code for a in answers] == [201] * DUPLICATES, [a.text for a in answers]
    replayed = [a.headers["idempotent-replayed"] for a in answers]
    assert replayed.count("false") == 1 and replayed.count("true") == DUPLICATES - 1
    assert len({a.content for a in answers}) == 1  # every replay is the transfer's answer
    assert len({a.headers["operation-id"] for a in answers}) == 1
    made = scalar(database, "SELECT count(*) FROM transfers WHERE source_id = :s", s=source)
    assert made == 1


@pytest.mark.parametrize("redis", ["up", "down"])
def test_concurrent_duplicates_of_a_new_transfer_make_one_and_replay_it(
    app_database: str, redis: str
) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-one-statement-"))
    embedded = EmbeddedRedis(data_dir)
    try:
        env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_REDIS_TIMEOUT": "0.5"}
        with ServerProcess(app_database, embedded.start(), env=env, workers=2) as server:
            key = new_principal(server.base_url)["api_key"]
            source = new_account(server.base_url, key, 100)
            destination = new_account(server.base_url, key, 0)
            if redis == "down":
                embedded.stop()
            answers = _duplicates(server, key, source, destination)
            _one_transfer_and_its_replays(answers, app_database, str(source))
            assert balance(server.base_url, key, source) == 93
    finally:
        embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
