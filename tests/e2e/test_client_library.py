"""settlement-client (clients/python) against real server processes: a lost response, an
in-progress operation, a lost provider answer settled by the feed, final answers, a storm
against a failing server; and its problem table against the server's."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx
import pytest
from settlement_client import (
    PROBLEMS,
    AttemptEvent,
    Client,
    IdempotencyKeyReused,
    InsufficientFunds,
    IntendedAction,
    KeyExpired,
    LeaseUnavailable,
    OperationOutcomeUnknown,
    RetryBudget,
    RetryPolicy,
)

from devstack import EmbeddedRedis
from service.problem_types import PROBLEM_TYPES
from tests.conftest import Services
from tests.e2e.client import ADMIN_KEY, PATIENCE, auth, new_account, new_principal, scalar, until
from tests.e2e.observer import Observer
from tests.e2e.provider import SECRET, ProviderProcess
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e

# The failpoint holds a transfer's transaction open this long, so a second request with
# the same key finds it in progress.
HOLD = 2
# Results kept this long on the retention server, so a key expires within the test.
RETENTION = "2"


class Events:
    """A metrics hook that keeps every attempt event."""

    def __init__(self) -> None:
        self.seen: list[AttemptEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: AttemptEvent) -> None:
        with self._lock:
            self.seen.append(event)

    def of(self, key: str) -> list[AttemptEvent]:
        return [e for e in self.seen if e.key == key]


class DroppingRelay:
    """A TCP relay that forwards requests but, for the first ``drop`` connections that get
    an answer, reads the server's answer and closes the client's connection instead: the
    request was sent and ran, its response never arrives."""

    def __init__(self, port: int, drop: int = 1) -> None:
        self._target = ("127.0.0.1", port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._drop = drop
        self.dropped = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._listener.close()
        self._thread.join(5)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                upstream.sendall(data)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            data = upstream.recv(65536)
            with self._lock:
                cut = bool(data) and self.dropped < self._drop
                self.dropped += cut
            if cut:  # shutdown wakes the other thread's recv, which close alone would not
                for sock in (client, upstream):
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
                return
            while data:
                client.sendall(data)
                data = upstream.recv(65536)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def client_key(server: ServerProcess) -> str:
    return str(new_principal(server.base_url)["api_key"])


def test_a_transfer_whose_response_is_lost_completes_exactly_once(
    server: ServerProcess, app_database: str, client_key: str
) -> None:
    source = new_account(server.base_url, client_key, 100)
    destination = new_account(server.base_url, client_key, 0)
    events = Events()
    with (
        DroppingRelay(server.port) as relay,
        Client(relay.base_url, client_key, hooks=[events]) as client,
    ):
        answer = client.create_transfer(source, destination, 30, "EUR")
    assert relay.dropped == 1
    assert answer.attempts == 2 and answer.replayed
    first, second = events.of(answer.key or "")
    assert (first.error, first.decision) == ("RemoteProtocolError", "retry")
    assert (second.status, second.replayed) == (201, True)
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=source) == 1
    assert scalar(app_database, "SELECT balance FROM accounts WHERE id = :a", a=source) == 70


def test_an_operation_in_progress_is_awaited_with_prefer_wait(
    services: Services, app_database: str, server: ServerProcess, client_key: str
) -> None:
    source = new_account(server.base_url, client_key, 100)
    destination = new_account(server.base_url, client_key, 0)
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_ENABLE_FAILPOINTS": "1",
        "SETTLEMENT_FAILPOINTS": f"effect.before_commit=sleep:{HOLD}",
    }
    key = uuid.uuid4().hex
    body = {"source": source, "destination": destination, "amount": 40, "currency": "EUR"}
    with ServerProcess(app_database, services.redis_url, env=env) as slow:
        first: list[httpx.Response] = []
        holder = threading.Thread(
            target=lambda: first.append(
                httpx.post(
                    f"{slow.base_url}/v1/transfers",
                    json=body,
                    headers={**auth(client_key), "Idempotency-Key": key},
                    timeout=PATIENCE,
                )
            )
        )
        holder.start()
        events = Events()
        with Client(slow.base_url, client_key, hooks=[events]) as client:

            def running() -> bool:
                with contextlib.suppress(Exception):
                    return client.find_operation(key).value.state == "in_progress"
                return False

            until(running, "the first request holds the operation")
            answer = client.create_transfer(source, destination, 40, "EUR", key=key)
        holder.join(PATIENCE)
    assert first[0].status_code == 201
    assert answer.replayed and answer.content == first[0].content
    said = [(e.status, e.slug, e.decision, e.prefer_wait) for e in events.of(key)]
    assert said[0] == (409, "operation-in-progress", "retry", RetryPolicy().prefer_wait)
    assert said[-1] == (201, "", "return", 0)
    moved = "SELECT count(*) FROM transfers WHERE source_id = :s"
    assert scalar(app_database, moved, s=source) == 1


def test_final_answers_are_raised_at_once(
    server: ServerProcess, app_database: str, client_key: str
) -> None:
    source = new_account(server.base_url, client_key, 100)
    destination = new_account(server.base_url, client_key, 0)
    events = Events()
    with Client(server.base_url, client_key, hooks=[events]) as client:
        client.create_transfer(source, destination, 10, "EUR", key="reused")
        with pytest.raises(IdempotencyKeyReused) as reused:
            client.create_transfer(source, destination, 11, "EUR", key="reused")
        assert (reused.value.attempts, reused.value.gave_up, reused.value.status) == (
            1,
            "final",
            422,
        )

        action = IntendedAction.transfer(source, destination, 1_000, "EUR")
        kept = IntendedAction.loads(action.dumps())  # as after the caller's restart
        with pytest.raises(InsufficientFunds) as poor:
            client.perform(action)
        with pytest.raises(InsufficientFunds) as again:
            client.perform(kept)
    assert (poor.value.attempts, poor.value.replayed, again.value.replayed) == (1, False, True)
    assert poor.value.operation_id == again.value.operation_id is not None
    assert poor.value.request_id and poor.value.problem.state == "failed"
    assert [e.decision for e in events.seen[1:]] == ["raise", "raise", "raise"]


def test_an_expired_key_is_raised_at_once(services: Services, app_database: str) -> None:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_RETENTION": RETENTION,
        "SETTLEMENT_SWEEP_INTERVAL": "0.2",
    }
    with ServerProcess(app_database, services.redis_url, env=env) as short:
        key = new_principal(short.base_url)["api_key"]
        source = new_account(short.base_url, key, 100)
        destination = new_account(short.base_url, key, 0)
        with Client(short.base_url, key) as client:
            done = client.create_transfer(source, destination, 10, "EUR", key="short-lived")

            def expired() -> bool:
                try:
                    client.find_operation("short-lived")
                except KeyExpired:
                    return True
                return False

            until(expired, "the key expires")
            with pytest.raises(KeyExpired) as gone:
                client.create_transfer(source, destination, 10, "EUR", key="short-lived")
    assert (gone.value.status, gone.value.attempts) == (410, 1)
    assert gone.value.operation_id == done.operation_id


def test_the_retry_budget_stops_a_storm_against_a_failing_server(app_database: str) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="settlement-client-redis-"))
    redis = EmbeddedRedis(data_dir)
    try:
        env = {
            "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "SETTLEMENT_REDIS_TIMEOUT": "0.5",
            # payouts on (never called: with Redis away the lease is refused first)
            "SETTLEMENT_PROVIDER_URL": "http://127.0.0.1:9",
            "SETTLEMENT_PROVIDER_SECRET": "s" * 32,
        }
        with ServerProcess(app_database, redis.start(), env=env) as failing:
            key = new_principal(failing.base_url)["api_key"]
            redis.stop()
            events = Events()
            budget = RetryBudget(capacity=3, refill_per_second=0)
            policy = RetryPolicy(max_attempts=10, base_backoff=0.01, max_retry_after=0.05)
            calls = 5
            with Client(failing.base_url, key, policy=policy, budget=budget, hooks=[events]) as c:
                for _ in range(calls):
                    with pytest.raises(LeaseUnavailable) as refused:
                        c.create_payout("ann", 1, "EUR")  # an attempt that needs the lease
                    assert refused.value.gave_up == "budget"
            # a degraded server's health is its answer (503, naming Redis), not a failure
            with Client(failing.base_url, key, policy=policy) as plain:
                health = plain.health()
            assert (health.status, health.attempts) == (503, 1)
            assert (health.value.status, health.value.redis, health.value.database) == (
                "degraded",
                "unavailable",
                "ok",
            )
    finally:
        redis.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert len(events.seen) == calls + 3  # one request per call, and the budget's 3 retries
    assert {(e.status, e.slug) for e in events.seen} == {(503, "lease-unavailable")}


def test_a_lost_payout_answer_is_settled_by_the_feed_and_followed(
    services: Services, app_database: str, provider: ProviderProcess
) -> None:
    env = {
        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "SETTLEMENT_PROVIDER_URL": provider.base_url,
        "SETTLEMENT_PROVIDER_SECRET": SECRET,
        "SETTLEMENT_PROVIDER_TIMEOUT": "0.8",
        "SETTLEMENT_LATE_RESPONSE_WINDOW": "0",  # only the feed can settle a dropped answer
    }
    with ServerProcess(app_database, services.redis_url, env=env) as paying:
        key = new_principal(paying.base_url)["api_key"]
        provider.arm("drop_response")
        follow = RetryPolicy(resend_unknown=False)
        with Client(paying.base_url, key, policy=follow) as client:
            with pytest.raises(OperationOutcomeUnknown) as lost:
                client.create_payout("ACME Supplies", 700, "EUR")
            assert (lost.value.status, lost.value.attempts) == (504, 1)
            operation_id = lost.value.operation_id
            assert operation_id is not None
            observer = Observer(services.redis_url, app_database, provider, "cursor")
            try:
                settled = client.wait_for_outcome(operation_id, timeout=PATIENCE)
            finally:
                observer.stop()
            replay = client.create_payout("ACME Supplies", 700, "EUR", key=lost.value.key)
    assert settled.state == "completed"
    assert settled.settled_by is not None and settled.settled_by.source == "feed"
    assert settled.result is not None and settled.result.status == 201
    assert replay.replayed and replay.value.id == operation_id
    assert provider.counts(f"{operation_id}:1") == {"count": 1, "declines": 0}


def test_the_client_knows_every_slug_and_whether_it_is_safe_to_retry(
    server: ServerProcess, client_key: str
) -> None:
    assert set(PROBLEMS) == set(PROBLEM_TYPES)
    with Client(server.base_url, client_key) as client:
        for slug, cls in PROBLEMS.items():
            page = client.problem_page(slug).value
            assert (slug, cls.retry_safe) == (slug, page.retry_with_same_key_safe)
