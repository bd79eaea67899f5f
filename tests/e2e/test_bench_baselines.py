"""The benchmark's baseline app (``bench.bare_app``) answers its routes: a broken baseline
would turn ``make bench`` ratios into ratios against errors."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, auth, balance, new_account, new_principal
from tests.e2e.server import ServerProcess


@pytest.fixture(scope="module")
def baseline(services: Services, app_database: str) -> Iterator[ServerProcess]:
    with ServerProcess(
        app_database,
        services.redis_url,
        env={"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY},
        module=("bench.bare_app",),
    ) as proc:
        yield proc


def test_the_bare_route_answers_without_io(baseline: ServerProcess) -> None:
    answer = httpx.get(f"{baseline.base_url}/bench/bare", timeout=5)
    assert answer.status_code == 200
    assert answer.json() == {"ok": True}


def test_the_plain_transfer_moves_money_once_per_request(baseline: ServerProcess) -> None:
    base = baseline.base_url
    key = new_principal(base)["api_key"]
    source, destination = new_account(base, key, 100), new_account(base, key, 0)
    body = {"source": source, "destination": destination, "amount": 30, "currency": "EUR"}
    for _ in range(2):  # no idempotency: each request is a transfer of its own
        answer = httpx.post(f"{base}/bench/plain-transfer", json=body, headers=auth(key), timeout=5)
        assert answer.status_code == 201, answer.text
        assert answer.json()["amount"] == 30
    assert (balance(base, key, source), balance(base, key, destination)) == (40, 60)
    refused = httpx.post(f"{base}/bench/plain-transfer", json=body, timeout=5)
    assert refused.status_code == 401
