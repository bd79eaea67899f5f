"""Redis is liveness, never authority: without it nothing new executes, replays still work."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from devstack import EmbeddedRedis
from tests.e2e.client import ADMIN_KEY, balance, new_account, new_principal, scalar, transfer
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def test_redis_down_refuses_new_work_but_replays_completed(app_database: str) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-redis-"))
    redis = EmbeddedRedis(data_dir)
    try:
        redis_url = redis.start()
        env = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_REDIS_TIMEOUT": "0.5"}
        with ServerProcess(app_database, redis_url, env=env) as server:
            key = new_principal(server.base_url)["api_key"]
            source = new_account(server.base_url, key, 100)
            destination = new_account(server.base_url, key, 0)
            done = transfer(server.base_url, key, "before-outage", source, destination, 10)
            assert done.status_code == 201

            redis.stop()

            refused = transfer(server.base_url, key, "during-outage", source, destination, 10)
            replayed = transfer(server.base_url, key, "before-outage", source, destination, 10)

            assert refused.status_code == 503
            assert refused.json()["type"] == "/problems/lease-unavailable"
            assert refused.headers["idempotent-replayed"] == "false"
            assert replayed.status_code == 201
            assert replayed.headers["idempotent-replayed"] == "true"
            assert replayed.content == done.content
            assert balance(server.base_url, key, source) == 90
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
