"""AsyncClient drives the same retry loop as Client (a scripted transport)."""

from __future__ import annotations

import httpx
import msgspec
import pytest
from settlement_client import AsyncClient, InsufficientFunds, RetryPolicy

FAST = RetryPolicy(base_backoff=0, max_backoff=0, max_retry_after=0)
TRANSFER = {
    "id": "t",
    "source": "a",
    "destination": "b",
    "amount": 1,
    "currency": "EUR",
    "memo": None,
    "created_at": "now",
}


def _problem(status: int, slug: str) -> httpx.Response:
    body = {"type": f"/problems/{slug}", "title": slug, "status": status, "detail": "x"}
    return httpx.Response(
        status,
        content=msgspec.json.encode(body),
        headers={"content-type": "application/problem+json"},
    )


async def test_async_retries_with_the_same_key_then_returns_the_replay() -> None:
    script = [
        _problem(409, "operation-in-progress"),
        _problem(503, "lease-unavailable"),
        httpx.Response(201, json=TRANSFER, headers={"Idempotent-Replayed": "true"}),
    ]
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return script[len(sent) - 1]

    transport = httpx.MockTransport(answer)
    async with AsyncClient("http://s.test", "k", policy=FAST, transport=transport) as client:
        got = await client.create_transfer("a", "b", 1, "EUR")
    assert (got.attempts, got.replayed, got.value.amount) == (3, True, 1)
    assert len({r.headers["idempotency-key"] for r in sent}) == 1
    assert sent[1].headers["prefer"] == f"wait={FAST.prefer_wait}"


async def test_async_raises_a_final_answer_at_once() -> None:
    transport = httpx.MockTransport(lambda request: _problem(402, "insufficient-funds"))
    async with AsyncClient("http://s.test", "k", policy=FAST, transport=transport) as client:
        with pytest.raises(InsufficientFunds) as refused:
            await client.create_transfer("a", "b", 1, "EUR")
    assert refused.value.attempts == 1
