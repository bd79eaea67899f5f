"""The server on a Redis Cluster (SETTLEMENT_REDIS_URL=redis+cluster://...): a master is
killed while transfers run; its replica takes over; no transfer runs twice."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from devstack import EmbeddedRedisCluster
from tests.e2e.client import ADMIN_KEY, balance, new_account, new_principal, scalar, transfer
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# Transfers of one unit each, every key sent twice at once from two threads: these before
# the kill, then as many new ones, with the first ones again (replays), through the failover.
KEYS = 30
# A request answered 503 (no lease: the slots failing over) or 409 (its duplicate holds
# the lease) is sent again until this long has passed.
PATIENCE = 60.0
# Between two tries of one request: a client's backoff.
BACKOFF = 0.05


def test_a_master_failing_over_under_load_runs_each_transfer_once(app_database: str) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-cluster-"))
    cluster = EmbeddedRedisCluster(data_dir)
    try:
        url = cluster.start()
        env = {
            "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "SETTLEMENT_REDIS_TIMEOUT": "0.5",
            # the transfers take the leased path, as a payout or the retry of an unsettled row
            # does (a new local operation's one statement takes no lease): claimed under the
            # scope's lease, then settled under the row's lock
            "SETTLEMENT_ENABLE_FAILPOINTS": "1",
            "SETTLEMENT_FAILPOINTS": "claim.after=sleep:0",
        }
        with ServerProcess(app_database, url, env=env) as server:
            base = server.base_url
            key = new_principal(base)["api_key"]
            source, destination = new_account(base, key, 1000), new_account(base, key, 0)
            unavailable: list[str] = []

            def settle(idempotency_key: str) -> httpx.Response:
                deadline = time.monotonic() + PATIENCE
                while True:
                    answer = transfer(base, key, idempotency_key, source, destination, 1)
                    if answer.status_code == 503:
                        assert answer.json()["type"] == "/problems/lease-unavailable"
                        unavailable.append(idempotency_key)
                    if answer.status_code not in (409, 503) or time.monotonic() > deadline:
                        return answer
                    time.sleep(BACKOFF)

            def run(keys: list[str]) -> dict[str, set[bytes]]:
                """Each key twice at once; the bodies each key was answered with."""
                sent = [k for k in keys for _ in range(2)]
                with ThreadPoolExecutor(max_workers=8) as pool:
                    replies = list(pool.map(settle, sent))
                bodies: dict[str, set[bytes]] = {}
                for k, reply in zip(sent, replies, strict=True):
                    assert reply.status_code == 201, reply.text
                    bodies.setdefault(k, set()).add(reply.content)
                return bodies

            first = [f"cluster-{uuid.uuid4().hex}" for _ in range(KEYS)]
            before = run(first)
            # a master dies: a lease key is a digest, so it served about a third of the keys
            cluster.kill(cluster.master_port("settlement:lease:x"))
            during = run([f"cluster-{uuid.uuid4().hex}" for _ in range(KEYS)] + first)

            assert unavailable  # its slots failed closed until the replica took over
            assert all(len(bodies) == 1 for bodies in during.values())  # one outcome per key
            assert all(during[k] == before[k] for k in first)  # replayed byte for byte
            assert balance(base, key, source) == 1000 - 2 * KEYS
            assert balance(base, key, destination) == 2 * KEYS
            assert (
                scalar(
                    app_database,
                    "SELECT count(*) FROM operations WHERE idempotency_key LIKE 'cluster-%'",
                )
                == 2 * KEYS
            )
    finally:
        cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
