"""Redis is liveness, never authority: without it no attempt that outlives one statement
executes (a payout), a new local operation (claimed, run and settled in one statement, with no
lease) still runs once, and replays still work."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import httpx
import pytest

from devstack import EmbeddedRedis
from tests.e2e.client import (
    ADMIN_KEY,
    auth,
    balance,
    new_account,
    new_principal,
    scalar,
    transfer,
)
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def test_redis_down_refuses_leased_work_but_replays_completed(app_database: str) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-redis-"))
    redis = EmbeddedRedis(data_dir)
    try:
        redis_url = redis.start()
        env = {
            "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "SETTLEMENT_REDIS_TIMEOUT": "0.5",
            # payouts on (never called: the lease is refused first)
            "SETTLEMENT_PROVIDER_URL": "http://127.0.0.1:9",
            "SETTLEMENT_PROVIDER_SECRET": "s" * 32,
        }
        with ServerProcess(app_database, redis_url, env=env) as server:
            key = new_principal(server.base_url)["api_key"]
            source = new_account(server.base_url, key, 100)
            destination = new_account(server.base_url, key, 0)
            done = transfer(server.base_url, key, "before-outage", source, destination, 10)
            assert done.status_code == 201

            redis.stop()

            refused = httpx.post(
                f"{server.base_url}/v1/payouts",
                json={"beneficiary": "ann", "amount": 10, "currency": "EUR"},
                headers={**auth(key), "Idempotency-Key": "during-outage"},
            )
            replayed = transfer(server.base_url, key, "before-outage", source, destination, 10)
            made = transfer(server.base_url, key, "new-in-outage", source, destination, 5)
            again = transfer(server.base_url, key, "new-in-outage", source, destination, 5)

            assert refused.status_code == 503
            assert refused.json()["type"] == "/problems/lease-unavailable"
            assert refused.headers["idempotent-replayed"] == "false"
            assert replayed.status_code == 201
            assert replayed.headers["idempotent-replayed"] == "true"
            assert replayed.content == done.content
            assert (made.status_code, made.headers["idempotent-replayed"]) == (201, "false")
            assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
            assert again.content == made.content
            assert balance(server.base_url, key, source) == 85  # each transfer moved once
            assert (
                scalar(
                    app_database,
                    "SELECT count(*) FROM operations WHERE idempotency_key = 'during-outage'",
                )
                == 0
            )
    finally:
        redis.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
