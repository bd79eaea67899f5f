"""POST /v1/refunds against a real server, through the client's generated ``create_refund``:
a refund moves money back, never more than the transfer across refunds and concurrent
requests, its refusals are stored and replayed, and the status resource shows it."""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from settlement_client import (
    Client,
    CurrencyMismatch,
    InsufficientFunds,
    IntendedAction,
    Problem,
    RefundExceedsTransfer,
    TransferNotFound,
    TransferNotRefundable,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from service.store.db import async_url
from tests.e2e.client import auth, new_principal, scalar, until
from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.e2e


def _client(server: ServerProcess, tenant: str = "acme") -> Client:
    return Client(server.base_url, new_principal(server.base_url, tenant)["api_key"])


def _balance(client: Client, account: str) -> int:
    return client.get_account(account).value.balance


def _transfer(client: Client, amount: int = 30) -> tuple[str, str, str]:
    """Two accounts of 100 and 0, and a transfer of ``amount`` between them."""
    source = client.create_account("EUR", 100).value.id
    destination = client.create_account("EUR").value.id
    moved = client.create_transfer(source, destination, amount, "EUR").value.id
    return source, destination, moved


def test_a_refund_moves_money_back_and_its_retry_replays_it(server: ServerProcess) -> None:
    with _client(server) as client:
        source, destination, moved = _transfer(client)
        made = client.create_refund(moved, 30, "EUR", memo="returned", key="refund-1")
        assert (made.status, made.replayed) == (201, False)
        assert (made.value.transfer, made.value.amount, made.value.memo) == (moved, 30, "returned")
        assert (_balance(client, source), _balance(client, destination)) == (100, 0)
        again = client.create_refund(moved, 30, "EUR", memo="returned", key="refund-1")
        assert again.replayed and again.value == made.value
        assert (_balance(client, source), _balance(client, destination)) == (100, 0)
        view = client.get_operation(str(made.operation_id)).value
        assert (view.route, view.state) == ("POST /v1/refunds", "completed")


def test_partial_refunds_stop_at_the_transfer_amount(server: ServerProcess) -> None:
    with _client(server) as client:
        source, destination, moved = _transfer(client)
        client.create_refund(moved, 10, "EUR")
        client.create_refund(moved, 10, "EUR")
        with pytest.raises(RefundExceedsTransfer) as exceeded:
            client.create_refund(moved, 11, "EUR", key="too-much")
        assert exceeded.value.status == 422
        assert "exceeds the 10 left" in str(exceeded.value.problem.detail)
        client.create_refund(moved, 10, "EUR")
        with pytest.raises(TransferNotRefundable):
            client.create_refund(moved, 1, "EUR")
        assert (_balance(client, source), _balance(client, destination)) == (100, 0)
        # a refusal is the operation's terminal outcome: stored, replayed for its key
        with pytest.raises(RefundExceedsTransfer) as replayed:
            client.create_refund(moved, 11, "EUR", key="too-much")
        assert replayed.value.replayed


def test_a_refund_names_what_is_wrong_and_changes_nothing(server: ServerProcess) -> None:
    with _client(server) as client, _client(server, tenant="other") as stranger:
        source, destination, moved = _transfer(client)
        with pytest.raises(CurrencyMismatch):
            client.create_refund(moved, 5, "USD")
        with pytest.raises(TransferNotFound):
            client.create_refund(str(uuid.uuid4()), 5, "EUR")
        with pytest.raises(TransferNotFound):  # another tenant's transfer is none of its own
            stranger.create_refund(moved, 5, "EUR")
        # the destination spent what it got: nothing to take back from it
        elsewhere = client.create_account("EUR").value.id
        client.create_transfer(destination, elsewhere, 25, "EUR")
        with pytest.raises(InsufficientFunds):
            client.create_refund(moved, 10, "EUR")
        assert [_balance(client, a) for a in (source, destination, elsewhere)] == [70, 5, 25]
        client.create_refund(moved, 5, "EUR")
        assert [_balance(client, a) for a in (source, destination, elsewhere)] == [75, 0, 25]


def test_a_bad_refund_body_is_a_validation_error(server: ServerProcess) -> None:
    key = new_principal(server.base_url)["api_key"]
    for body in (
        {"transfer": "nope", "amount": 1, "currency": "EUR"},
        {"transfer": str(uuid.uuid4()), "amount": 0, "currency": "EUR"},
        {"transfer": str(uuid.uuid4()), "amount": 1, "currency": "XXQ"},
        {"transfer": str(uuid.uuid4()), "amount": 1, "currency": "EUR", "extra": 1},
    ):
        answer = httpx.post(
            f"{server.base_url}/v1/refunds",
            json=body,
            headers={**auth(key), "Idempotency-Key": uuid.uuid4().hex},
        )
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["type"] == "/problems/validation-error"


def test_concurrent_refunds_never_refund_more_than_the_transfer(
    server: ServerProcess, app_database: str
) -> None:
    """Twelve refunds of 10 at once against a transfer of 30, each with its own key, and
    each sent twice at once (a retry racing its original): three refunds apply, every other
    is refused, and what the accounts and the refund rows say agrees."""
    with _client(server) as client:
        source, destination, moved = _transfer(client)
        actions = [IntendedAction.refund(moved, 10, "EUR") for _ in range(12)]

        def send(action: IntendedAction) -> str:
            try:
                answer = client.perform(action)
            except (RefundExceedsTransfer, TransferNotRefundable) as refused:
                return refused.slug
            except Problem as other:  # anything else is a defect of the refund's rules
                return f"unexpected {other.slug}"
            return str(answer.value.id)

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(send, actions + actions))
        first, second = results[:12], results[12:]
        assert first == second  # a retry answers what its original answered
        made = {r for r in first if not r.startswith(("refund-", "transfer-", "unexpected"))}
        assert len(made) == 3, results
        assert not [r for r in first if r.startswith("unexpected")], results
        assert (_balance(client, source), _balance(client, destination)) == (100, 0)
    assert (
        scalar(
            app_database,
            "SELECT coalesce(sum(amount), 0) FROM refunds WHERE transfer_id = :t",
            t=uuid.UUID(moved),
        )
        == 30
    )


class _AccountsHeld:
    """Another transaction holding both accounts' row locks until :meth:`release`."""

    def __init__(self, database_url: str, accounts: list[str]) -> None:
        self._url, self._ids = database_url, [uuid.UUID(a) for a in accounts]
        self._held, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)

    async def _hold(self) -> None:
        engine = create_async_engine(async_url(self._url))
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    text("SELECT id FROM accounts WHERE id = ANY(:ids) ORDER BY id FOR UPDATE"),
                    {"ids": self._ids},
                )
                self._held.set()
                await asyncio.get_running_loop().run_in_executor(None, self._release.wait)
        finally:
            await engine.dispose()

    def __enter__(self) -> _AccountsHeld:
        self._thread.start()
        assert self._held.wait(30)
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_two_first_refunds_that_race_are_judged_one_after_the_other(
    server: ServerProcess, app_database: str
) -> None:
    """Two first refunds of one transfer wait together behind a lock: the second is judged on
    what the first refunded (422 refund-exceeds-transfer), never on a balance the first
    already took (402 insufficient-funds, which would be stored and replayed for its key)."""
    with _client(server) as client:
        source = client.create_account("EUR", 100).value.id
        destination = client.create_account("EUR").value.id
        moved = client.create_transfer(source, destination, 100, "EUR").value.id
        answers: dict[int, int | str] = {}

        def refund(amount: int) -> None:
            try:
                answers[amount] = client.create_refund(
                    moved, amount, "EUR", key=f"r{amount}"
                ).status
            except Problem as refused:
                answers[amount] = refused.slug

        with _AccountsHeld(app_database, [source, destination]) as held:
            threads = [threading.Thread(target=refund, args=(n,)) for n in (60, 50)]
            for thread in threads:
                thread.start()
            # both wait: one on the accounts' locks, the other on the transfer's row
            until(
                lambda: (
                    scalar(app_database, "SELECT count(*) FROM pg_locks WHERE NOT granted") >= 2
                ),
                "both refunds waiting on a lock",
            )
            held.release()
            for thread in threads:
                thread.join(30)
        assert sorted(map(str, answers.values())) == ["201", "refund-exceeds-transfer"], answers
        assert (_balance(client, source), _balance(client, destination)) in ((60, 40), (50, 50))
