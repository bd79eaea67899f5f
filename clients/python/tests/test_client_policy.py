"""The retry policy as a table, backoff bounds, the budget, Retry-After parsing, and key
reuse over any sequence of answers (a scripted transport: the server's answers, not the
server, are what these tests vary)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from settlement_client import (
    PROBLEMS,
    Client,
    Observed,
    RetryBudget,
    RetryPolicy,
    SettlementError,
    TransportFailed,
    parse_retry_after,
)

RNG_SEED = 7
POLICY = RetryPolicy(max_attempts=4, deadline=10.0, prefer_wait=5)


def decide(seen: Observed, attempt: int = 1, elapsed: float = 0.0, idempotent: bool = True):
    return POLICY.decide(
        seen,
        attempt=attempt,
        elapsed=elapsed,
        idempotent=idempotent,
        rng=random.Random(RNG_SEED),
        budget=None,
    )


# answer, attempt -> action, why, Prefer wait
TABLE = [
    (Observed(201), 1, "return", "final", 0),
    (Observed(200), 3, "return", "final", 0),
    (Observed(402, "insufficient-funds"), 1, "raise", "final", 0),
    (Observed(404, "account-not-found"), 1, "raise", "final", 0),
    (Observed(404, "not-found"), 1, "raise", "final", 0),
    (Observed(410, "idempotency-key-expired"), 1, "raise", "final", 0),
    (Observed(422, "fingerprint-mismatch"), 1, "raise", "final", 0),
    (Observed(400, "validation-error"), 1, "raise", "final", 0),
    (Observed(401, "unauthenticated"), 1, "raise", "final", 0),
    (Observed(409, "binding-mismatch"), 1, "raise", "final", 0),
    (Observed(409, "operation-conflict"), 1, "raise", "final", 0),
    (Observed(409, "operation-in-progress"), 1, "retry", "final", 5),
    (Observed(409, "operation-in-progress"), 4, "raise", "attempts", 0),
    (Observed(409, "effect-refused", retry_after="1"), 1, "retry", "final", 0),
    (Observed(409, "operation-superseded"), 2, "retry", "final", 0),
    (Observed(429, "too-many-requests"), 1, "retry", "final", 0),
    (Observed(500, "internal-error"), 1, "retry", "final", 0),
    (Observed(500), 3, "retry", "final", 0),
    (Observed(503, "lease-unavailable"), 1, "retry", "final", 0),
    (Observed(503, "service-unavailable"), 4, "raise", "attempts", 0),
    (Observed(504, "operation-outcome-unknown"), 1, "retry", "final", 0),
    (Observed(error="ConnectError", sent=False), 1, "retry", "final", 0),
    (Observed(error="ReadTimeout"), 2, "retry", "final", 0),
    (Observed(error="ReadTimeout"), 4, "raise", "attempts", 0),
]


@pytest.mark.parametrize(("seen", "attempt", "action", "why", "prefer"), TABLE)
def test_policy_table(seen: Observed, attempt: int, action: str, why: str, prefer: int) -> None:
    decision = decide(seen, attempt)
    assert (decision.action, decision.why, decision.prefer_wait) == (action, why, prefer)


def test_every_retry_safe_slug_is_retried_and_every_other_slug_is_final() -> None:
    for slug, cls in PROBLEMS.items():
        status = 409 if slug in ("effect-refused", "operation-superseded") else 400
        if cls.retry_safe and slug not in ("effect-refused", "operation-superseded"):
            continue  # their statuses (409 in progress, 429, 5xx) are in the table above
        assert (decide(Observed(status, slug)).action == "retry") is cls.retry_safe, slug


def test_without_a_key_only_what_was_never_sent_is_retried() -> None:
    assert decide(Observed(error="ConnectError", sent=False), idempotent=False).action == "retry"
    lost = decide(Observed(error="ReadTimeout"), idempotent=False)
    assert (lost.action, lost.why) == ("raise", "not-idempotent")
    assert decide(Observed(503, "service-unavailable"), idempotent=False).action == "raise"
    assert decide(Observed(429, "too-many-requests"), idempotent=False).action == "retry"


def test_an_unknown_outcome_is_raised_at_once_when_the_caller_follows_it() -> None:
    follow = RetryPolicy(resend_unknown=False)
    seen = Observed(504, "operation-outcome-unknown")
    decision = follow.decide(
        seen, attempt=1, elapsed=0, idempotent=True, rng=random.Random(), budget=None
    )
    assert (decision.action, decision.why) == ("raise", "final")


def test_retry_after_is_honoured_and_clipped() -> None:
    assert decide(Observed(503, "lease-unavailable", retry_after="3")).wait >= 3
    clipped = RetryPolicy(max_retry_after=0.5, deadline=10).decide(
        Observed(503, retry_after="3600"),
        attempt=1,
        elapsed=0,
        idempotent=True,
        rng=random.Random(),
        budget=None,
    )
    assert 0.5 <= clipped.wait <= RetryPolicy().base_backoff + 0.5


def test_no_retry_whose_wait_would_pass_the_deadline() -> None:
    decision = decide(Observed(503, retry_after="5"), elapsed=POLICY.deadline - 4)
    assert (decision.action, decision.why) == ("raise", "deadline")
    late = decide(Observed(409, "operation-in-progress"), elapsed=POLICY.deadline - 2)
    assert (late.action, late.prefer_wait) == ("retry", 2)  # the wait asked shrinks to fit


@given(retry=st.integers(1, 40), seed=st.integers(0, 2**32))
def test_backoff_is_full_jitter_within_its_bounds(retry: int, seed: int) -> None:
    wait = POLICY.backoff(retry, random.Random(seed))
    assert 0 <= wait <= min(POLICY.max_backoff, POLICY.base_backoff * 2 ** (retry - 1))


def test_backoff_spreads_over_its_whole_range() -> None:
    rng = random.Random(RNG_SEED)
    waits = [POLICY.backoff(3, rng) for _ in range(2000)]
    ceiling = POLICY.base_backoff * 4
    assert min(waits) < ceiling * 0.05 and max(waits) > ceiling * 0.95


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_runs_dry_then_refills_at_its_rate() -> None:
    clock = Clock()
    budget = RetryBudget(capacity=3, refill_per_second=0.5, clock=clock)
    assert [budget.try_take() for _ in range(4)] == [True, True, True, False]
    clock.now = 1.0
    assert not budget.try_take()  # half a token
    clock.now = 2.0
    assert budget.try_take() and not budget.try_take()
    clock.now = 1000.0
    assert budget.tokens == 3  # never above capacity


def test_an_empty_budget_stops_the_retry() -> None:
    clock = Clock()
    budget = RetryBudget(capacity=1, refill_per_second=0, clock=clock)
    kwargs = {"attempt": 1, "elapsed": 0.0, "idempotent": True, "rng": random.Random()}
    seen = Observed(503, "service-unavailable")
    assert POLICY.decide(seen, budget=budget, **kwargs).action == "retry"  # type: ignore[arg-type]
    stopped = POLICY.decide(seen, budget=budget, **kwargs)  # type: ignore[arg-type]
    assert (stopped.action, stopped.why) == ("raise", "budget")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("0", 0.0), ("7", 7.0), (" 12 ", 12.0), (None, None), ("soon", None), ("-3", None)],
)
def test_retry_after_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_retry_after_http_date() -> None:
    now = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, now=now) == 90.0
    earlier = format_datetime(now - timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(earlier, now=now) == 0.0


# -- key reuse over sequences of answers ---------------------------------------------------------

ANSWERS = st.sampled_from(
    [
        (201, ""),
        (402, "insufficient-funds"),
        (409, "operation-in-progress"),
        (409, "effect-refused"),
        (410, "idempotency-key-expired"),
        (422, "fingerprint-mismatch"),
        (429, "too-many-requests"),
        (500, "internal-error"),
        (503, "lease-unavailable"),
        (504, "operation-outcome-unknown"),
        (0, "ReadError"),
        (0, "ConnectError"),
    ]
)
FAST = RetryPolicy(max_attempts=6, base_backoff=0, max_backoff=0, max_retry_after=0, prefer_wait=1)
TRANSFER = {
    "id": "t",
    "source": "a",
    "destination": "b",
    "amount": 1,
    "currency": "EUR",
    "memo": None,
    "created_at": "now",
}


@settings(max_examples=200, deadline=None)
@given(script=st.lists(ANSWERS, min_size=1, max_size=8), given_key=st.booleans())
def test_every_retry_of_one_call_sends_the_same_key(
    script: list[tuple[int, str]], given_key: bool
) -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        status, slug = script[min(len(sent), len(script) - 1)]
        sent.append(request)
        if status == 0:
            raise getattr(httpx, slug)("scripted", request=request)
        if status == 201:
            return httpx.Response(201, json=TRANSFER, headers={"Idempotent-Replayed": "true"})
        problem = {"type": f"/problems/{slug}", "title": slug, "status": status, "detail": "x"}
        return httpx.Response(
            status,
            content=msgspec.json.encode(problem),
            headers={"content-type": "application/problem+json", "Retry-After": "0"},
        )

    transport = httpx.MockTransport(answer)
    with Client("http://settlement.test", "k", policy=FAST, transport=transport) as client:
        try:
            got = client.create_transfer("a", "b", 1, "EUR", key="mine" if given_key else None)
        except SettlementError as error:
            outcome: object = error
            attempts, key = error.attempts, error.key
        else:
            outcome, attempts, key = got, got.attempts, got.key
            assert got.replayed
    keys = {r.headers["idempotency-key"] for r in sent}
    assert keys == {key} and len(sent) == attempts <= FAST.max_attempts
    assert key == "mine" if given_key else len(str(key)) == 36
    # a call stops at its first final answer; every answer before it was retryable
    for status, slug in script[: attempts - 1]:
        assert status == 0 or PROBLEMS[slug].retry_safe
    if isinstance(outcome, TransportFailed):
        assert outcome.sent == (script[min(attempts, len(script)) - 1][1] != "ConnectError")
    prefer = [r.headers.get("prefer") for r in sent[1:]]
    after_in_progress = [
        script[n][1] == "operation-in-progress" for n in range(min(attempts, len(script)) - 1)
    ]
    assert [p is not None for p in prefer][: len(after_in_progress)] == after_in_progress
