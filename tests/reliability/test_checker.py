"""The chaos checker's 402 rule on histories written by hand: a refusal must be judged on a
balance its account had while the client waited, and never while the balance covered the
amount throughout."""

from __future__ import annotations

from typing import Any

from tests.reliability.harness import Action, Ledger, Summary, _check_refusals

A, B = "acct-a", "acct-b"
OPENINGS = {A: 100, B: 0}


class _Clients:
    def __init__(self, *actions: Action) -> None:
        self.actions = list(actions)
        self.openings = OPENINGS


def _refused(judged: int, amount: int, sent: float, answered: float) -> Action:
    body = {"source": A, "destination": B, "amount": amount, "currency": "EUR"}
    problem = (
        '{"type":"/problems/insufficient-funds","detail":'
        f'"source balance {judged} is below the amount {amount}"}}'
    )
    return Action(
        "k",
        "transfer",
        body,
        wait=False,
        answers=[(402, problem.encode())],
        sent_at=sent,
        answered_at=answered,
    )


def _violations(ledger: Ledger, action: Action) -> list[str]:
    summary = Summary(seed=0, duration=0)
    clients: Any = _Clients(action)
    _check_refusals(clients, ledger, summary)
    return summary.violations


# A is debited 80 at t=10 (100 -> 20), credited 50 at t=20 (20 -> 70)
LEDGER = Ledger([(10.0, A, B, 80), (20.0, B, A, 50)])


def test_a_402_on_the_balance_the_account_had_at_that_moment_passes() -> None:
    assert _violations(LEDGER, _refused(20, 30, sent=12.0, answered=15.0)) == []
    # the window spans the credit: either balance may have been the one judged
    assert _violations(LEDGER, _refused(20, 30, sent=15.0, answered=25.0)) == []


def test_a_402_on_a_balance_older_than_the_request_is_a_violation() -> None:
    """Judged on 20 although the credit had made it 70 before the request was sent."""
    assert _violations(LEDGER, _refused(20, 30, sent=21.0, answered=22.0))


def test_a_402_while_the_balance_covered_the_amount_throughout_is_a_violation() -> None:
    assert _violations(LEDGER, _refused(100, 90, sent=1.0, answered=5.0))


def test_the_ledger_replays_balances_and_their_lowest() -> None:
    assert LEDGER.balances(OPENINGS) == {A: 70, B: 30}
    assert LEDGER.lowest(OPENINGS) == {A: 20, B: 0}
    assert LEDGER.between(A, 100, 0.0, 30.0) == {100, 20, 70}
    assert LEDGER.between(A, 100, 11.0, 19.0) == {20}
