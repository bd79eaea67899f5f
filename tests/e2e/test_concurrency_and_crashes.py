"""Concurrency across two server processes, crashes at failpoints, slow handlers."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest

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

pytestmark = pytest.mark.e2e

LEASE_TTL = 1.0
BASE_ENV = {"SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY, "SETTLEMENT_LEASE_TTL": str(LEASE_TTL)}


def _failpoint_env(spec: str) -> dict[str, str]:
    return {**BASE_ENV, "SETTLEMENT_ENABLE_FAILPOINTS": "1", "SETTLEMENT_FAILPOINTS": spec}


def _in_progress(app_database: str, key: str) -> None:
    """Until the operation under ``key`` is claimed and in progress."""
    until(
        lambda: (
            scalar(
                app_database,
                "SELECT count(*) FROM operations WHERE idempotency_key = :k"
                " AND state = 'in_progress'",
                k=key,
            )
            == 1
        ),
        f"{key} in progress",
    )


def test_hundred_concurrent_identical_requests_over_two_processes_execute_once(
    services: Services, app_database: str
) -> None:
    with (
        ServerProcess(app_database, services.redis_url, env=BASE_ENV) as one,
        ServerProcess(app_database, services.redis_url, env=BASE_ENV) as two,
    ):
        key = new_principal(one.base_url)["api_key"]
        source = new_account(one.base_url, key, 1000)
        destination = new_account(one.base_url, key, 0)
        bases = [one.base_url, two.base_url]

        def send(i: int) -> httpx.Response:
            return transfer(bases[i % 2], key, "stampede", source, destination, 25)

        with ThreadPoolExecutor(max_workers=50) as pool:
            responses = list(pool.map(send, range(100)))

        outcomes = Counter(
            (r.status_code, r.headers.get("idempotent-replayed"))
            if r.status_code == 201
            else (r.status_code, r.json()["type"])
            for r in responses
        )
        assert set(outcomes) <= {
            (201, "false"),
            (201, "true"),
            (409, "/problems/operation-in-progress"),
        }, outcomes
        assert outcomes[(201, "false")] == 1, outcomes
        assert (
            scalar(app_database, "SELECT count(*) FROM transfers WHERE source_id = :s", s=source)
            == 1
        )
        assert balance(one.base_url, key, source) == 975
        assert balance(two.base_url, key, destination) == 25


@pytest.mark.parametrize("failpoint", ["effect.before_commit", "effect.after_commit"])
def test_sigkill_at_failpoint_then_retry_completes_exactly_once(
    services: Services, app_database: str, failpoint: str
) -> None:
    with ServerProcess(app_database, services.redis_url, env=BASE_ENV) as setup:
        key = new_principal(setup.base_url)["api_key"]
        source = new_account(setup.base_url, key, 100)
        destination = new_account(setup.base_url, key, 0)

    doomed = ServerProcess(
        app_database, services.redis_url, env=_failpoint_env(f"{failpoint}=sleep:60")
    ).start()
    try:
        thread = threading.Thread(
            target=lambda: _swallow(
                lambda: transfer(doomed.base_url, key, "crashy", source, destination, 40)
            ),
            daemon=True,
        )
        thread.start()
        if failpoint == "effect.before_commit":
            until(
                lambda: (
                    scalar(
                        app_database,
                        "SELECT count(*) FROM attempts a JOIN operations o"
                        " ON o.id = a.operation_id WHERE o.idempotency_key = 'crashy'",
                    )
                    == 1
                ),
                "the crashy attempt begun",
            )
            # inside the effect's transaction, held open at the failpoint before its commit
            in_effect(app_database, 1)
        else:
            until(
                lambda: (
                    scalar(
                        app_database,
                        "SELECT count(*) FROM transfers WHERE source_id = :s",
                        s=source,
                    )
                    == 1
                ),
                "the crashy transfer committed",
            )
        doomed.stop(signal.SIGKILL)
    finally:
        doomed.stop(signal.SIGKILL)

    with ServerProcess(app_database, services.redis_url, env=BASE_ENV) as restarted:
        # the dead worker's lease holds the key until it runs out: retried until then
        retry = _past_the_dead_lease(
            lambda: transfer(restarted.base_url, key, "crashy", source, destination, 40)
        )
        again = transfer(restarted.base_url, key, "crashy", source, destination, 40)
        assert retry.status_code == 201, retry.text
        if failpoint == "effect.after_commit":
            assert retry.headers["idempotent-replayed"] == "true"
        else:
            assert retry.headers["idempotent-replayed"] == "false"
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == retry.content
        assert balance(restarted.base_url, key, source) == 60
        assert balance(restarted.base_url, key, destination) == 40
    assert (
        scalar(app_database, "SELECT count(*) FROM transfers WHERE source_id = :s", s=source) == 1
    )


def _past_the_dead_lease(send: Callable[[], httpx.Response]) -> httpx.Response:
    """``send``'s first answer that is not 409 ``operation-in-progress``: a dead worker's
    lease holds the scope until it runs out (one lease TTL)."""
    deadline = time.monotonic() + 15.0
    while True:
        answer = send()
        busy = answer.status_code == 409 and answer.json()["type"].endswith("operation-in-progress")
        if not busy or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("failpoint", "committed"),
    [("effect.before_statement", False), ("effect.after_commit", True)],
)
def test_sigkill_around_the_one_statement_of_a_new_transfer_then_retry_gets_one_outcome(
    services: Services, app_database: str, failpoint: str, committed: bool
) -> None:
    """The way production settles a new transfer (claim, effect and settlement in one
    statement), with the server killed right before that statement and right after it
    commits: the retry gets the one outcome and the money moves once."""
    with ServerProcess(app_database, services.redis_url, env=BASE_ENV) as setup:
        key = new_principal(setup.base_url)["api_key"]
        source = new_account(setup.base_url, key, 100)
        destination = new_account(setup.base_url, key, 0)
    idem = f"killed-{failpoint}"  # the database is shared with the other parameter's run

    doomed = ServerProcess(
        app_database, services.redis_url, env=_failpoint_env(f"{failpoint}=crash")
    ).start()
    try:
        with pytest.raises(httpx.TransportError):  # killed mid-request: no answer at all
            transfer(doomed.base_url, key, idem, source, destination, 40)
        assert doomed.wait_exit() == -signal.SIGKILL
    finally:
        doomed.stop(signal.SIGKILL)
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=source) == (1 if committed else 0)
    # one statement or nothing: never a row left in_progress, an attempt begun and ended at
    # once (the one statement's) when there is one
    rows = "SELECT count(*) FROM operations WHERE idempotency_key = :k"
    assert scalar(app_database, rows, k=idem) == (1 if committed else 0)
    if committed:
        assert (
            scalar(
                app_database,
                "SELECT o.state || ':' || (a.started_at = a.finished_at)::text FROM operations o"
                " JOIN attempts a ON a.operation_id = o.id WHERE o.idempotency_key = :k",
                k=idem,
            )
            == "completed:true"
        )

    with ServerProcess(app_database, services.redis_url, env=BASE_ENV) as restarted:
        retry = _past_the_dead_lease(
            lambda: transfer(restarted.base_url, key, idem, source, destination, 40)
        )
        again = transfer(restarted.base_url, key, idem, source, destination, 40)
        assert retry.status_code == 201, retry.text
        assert retry.headers["idempotent-replayed"] == ("true" if committed else "false")
        assert (again.status_code, again.headers["idempotent-replayed"]) == (201, "true")
        assert again.content == retry.content
        assert balance(restarted.base_url, key, source) == 60
        assert balance(restarted.base_url, key, destination) == 40
    assert scalar(app_database, moved, s=source) == 1


def test_slow_handler_keeps_its_lease_and_a_second_request_gets_409(
    services: Services, app_database: str
) -> None:
    slow = _failpoint_env(f"effect.before_commit=sleep:{LEASE_TTL * 3}")
    with ServerProcess(app_database, services.redis_url, env=slow) as server:
        key = new_principal(server.base_url)["api_key"]
        source = new_account(server.base_url, key, 100)
        destination = new_account(server.base_url, key, 0)
        results: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: results.append(
                transfer(server.base_url, key, "slow", source, destination, 10)
            )
        )
        thread.start()
        _in_progress(app_database, "slow")  # the first attempt holds the key
        time.sleep(LEASE_TTL * 1.8)  # time itself: well past one TTL, only heartbeats keep it
        second = transfer(server.base_url, key, "slow", source, destination, 10)
        asked_at = datetime.now(UTC)
        live = httpx.get(f"{server.base_url}{second.headers['location']}", headers=auth(key))
        thread.join(30)
        # past its claim-time expiry the status still shows the heartbeated lease from Redis
        assert live.status_code == 200, live.text
        assert live.json()["state"] == "in_progress"
        shown = datetime.fromisoformat(live.json()["lease"]["expires_at"])
        assert shown > asked_at  # the claim-time expiry passed 0.8 TTL before we asked

        assert second.status_code == 409
        assert second.json()["type"] == "/problems/operation-in-progress"
        assert second.headers["retry-after"]
        assert second.headers["location"].startswith("/v1/operations/")
        assert results and results[0].status_code == 201
        assert results[0].headers["idempotent-replayed"] == "false"
        assert balance(server.base_url, key, source) == 90


def test_prefer_wait_returns_the_outcome_once_settled(
    services: Services, app_database: str
) -> None:
    slow = _failpoint_env("effect.before_commit=sleep:1.5")
    with ServerProcess(app_database, services.redis_url, env=slow) as server:
        key = new_principal(server.base_url)["api_key"]
        source = new_account(server.base_url, key, 100)
        destination = new_account(server.base_url, key, 0)
        results: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: results.append(
                transfer(server.base_url, key, "waited", source, destination, 10)
            )
        )
        thread.start()
        _in_progress(app_database, "waited")  # the first attempt holds the key
        waited = transfer(
            server.base_url, key, "waited", source, destination, 10, headers={"Prefer": "wait=5"}
        )
        thread.join(30)
        assert waited.status_code == 201, waited.text
        assert waited.headers["idempotent-replayed"] == "true"
        assert waited.headers["preference-applied"] == "wait=5"
        assert results[0].content == waited.content


def _swallow(call: object) -> None:
    with contextlib.suppress(httpx.HTTPError):
        call()  # type: ignore[operator]


def test_lost_lease_cancels_the_handler_and_commits_nothing(
    services: Services, app_database: str
) -> None:
    with ServerProcess(app_database, services.redis_url, env=BASE_ENV) as setup:
        key = new_principal(setup.base_url)["api_key"]
        source = new_account(setup.base_url, key, 100)
        destination = new_account(setup.base_url, key, 0)
    broken = _failpoint_env("lease.heartbeat=error,effect.before_commit=sleep:5")
    with ServerProcess(app_database, services.redis_url, env=broken) as server:
        started = time.monotonic()
        lost = transfer(server.base_url, key, "heartless", source, destination, 10)
        elapsed = time.monotonic() - started

        assert lost.status_code == 503
        assert lost.json()["type"] == "/problems/lease-unavailable"
        assert elapsed < 5  # cancelled at the first failed heartbeat, not after the sleep
        assert balance(server.base_url, key, source) == 100
        assert (
            scalar(app_database, "SELECT count(*) FROM transfers WHERE source_id = :s", s=source)
            == 0
        )
    with ServerProcess(app_database, services.redis_url, env=BASE_ENV) as healthy:
        # the lost attempt's lease holds the key until it runs out: retried until then
        retry = _past_the_dead_lease(
            lambda: transfer(healthy.base_url, key, "heartless", source, destination, 10)
        )
        assert retry.status_code == 201
        assert retry.headers["idempotent-replayed"] == "false"
        assert balance(healthy.base_url, key, source) == 90


def test_prefer_wait_with_another_body_is_still_a_fingerprint_mismatch(
    services: Services, app_database: str
) -> None:
    slow = _failpoint_env("effect.before_commit=sleep:1.5")
    with ServerProcess(app_database, services.redis_url, env=slow) as server:
        key = new_principal(server.base_url)["api_key"]
        source = new_account(server.base_url, key, 100)
        destination = new_account(server.base_url, key, 0)
        thread = threading.Thread(
            target=lambda: transfer(server.base_url, key, "edited", source, destination, 10)
        )
        thread.start()
        _in_progress(app_database, "edited")  # the first attempt holds the key
        edited = transfer(
            server.base_url, key, "edited", source, destination, 99, headers={"Prefer": "wait=5"}
        )
        thread.join(30)
        assert edited.status_code in (409, 422), edited.text
        if edited.status_code == 409:  # answered before the first one settled
            assert edited.json()["type"] == "/problems/operation-in-progress"
        else:
            assert edited.json()["type"] == "/problems/fingerprint-mismatch"
        assert balance(server.base_url, key, source) == 90
