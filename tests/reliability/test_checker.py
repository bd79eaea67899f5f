"""The chaos checker's rules on histories written by hand: a 402 refusal must be judged on a
balance its account had while the client waited, and never while the balance covered the
amount throughout; the feed rules (one final receipt per event and feed, no hold past its
limit, no checkpoint past an event without a final receipt) on rows written by hand."""

from __future__ import annotations

from typing import Any

from tests.reliability.feed_rules import (
    Checkpoint,
    Event,
    Receipt,
    Snapshot,
    Violation,
    caught_up,
    final_violations,
    hold_violations,
    late,
    passed_violations,
    receipt_violations,
    sample_violations,
)
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


# -- the feed rules (tests/reliability/feed_rules.py) ---------------------------------------

CURSOR, TS = "payments", "payments-ts"
FEED_KINDS = {CURSOR: "cursor", TS: "timestamp"}


def _event(n: int, position: int, timestamp: int, *, backfill: bool = False) -> Event:
    """The ``n``-th payment the provider committed."""
    return Event(f"evt_{n}", position, timestamp, inserted=n, backfill=backfill)


def _receipts(feed: str, *events: Event, state: str = "applied", age: float = 1.0) -> list[Receipt]:
    return [Receipt(feed, e.event_id, state, age=age) for e in events]


# three payments at positions 10, 20, 30 and timestamps 100, 100, 101; then a backfill the
# cursor feed got behind its cursor (position 15, the clock's timestamp 102), and one the
# timestamp feed got at a closed timestamp (the next position 40, timestamp 100)
E1, E2, E3 = _event(1, 10, 100), _event(2, 20, 100), _event(3, 30, 101)
CURSOR_BACKFILL = _event(4, 15, 102, backfill=True)
TS_BACKFILL = _event(5, 40, 100, backfill=True)
EVENTS = [E1, E2, E3, CURSOR_BACKFILL, TS_BACKFILL]


def _rules(violations: list[Violation]) -> set[tuple[str, str, str]]:
    return {(v.rule, v.feed, v.event_id) for v in violations}


def test_an_event_inserted_behind_one_committed_before_it_is_late_on_that_feed_only() -> None:
    assert late(EVENTS, "cursor") == {CURSOR_BACKFILL.event_id}
    assert late(EVENTS, "timestamp") == {TS_BACKFILL.event_id}
    # a tie with the newest timestamp is not late
    assert late([E1, E2], "timestamp") == frozenset()


def test_every_event_needs_exactly_one_final_receipt_on_each_feed() -> None:
    receipts = [
        *_receipts(CURSOR, E1, E2, CURSOR_BACKFILL, TS_BACKFILL),
        Receipt(CURSOR, E3.event_id, "held", "unknown-operation"),
        *_receipts(TS, E1, E2, E3),  # the timestamp feed never found its backfill
    ]
    assert _rules(receipt_violations(CURSOR, EVENTS, receipts)) == {
        ("receipts", CURSOR, E3.event_id)
    }
    missing = receipt_violations(TS, EVENTS, receipts)
    assert _rules(missing) == {
        ("receipts", TS, CURSOR_BACKFILL.event_id),
        ("receipts", TS, TS_BACKFILL.event_id),
    }
    assert "no receipt" in str(missing[0])


def test_two_receipts_for_one_event_or_one_for_an_event_never_served_are_violations() -> None:
    receipts = [
        *_receipts(CURSOR, E1, E1, E2, E3),
        Receipt(CURSOR, "evt_never", "quarantined", "unknown-operation"),
    ]
    found = receipt_violations(CURSOR, [E1, E2, E3], receipts)
    assert _rules(found) == {("receipts", CURSOR, E1.event_id), ("receipts", CURSOR, "evt_never")}
    assert any("never served" in str(v) for v in found)


def test_a_hold_past_its_limit_is_a_violation_and_a_final_receipt_of_any_age_is_not() -> None:
    receipts = [
        Receipt(CURSOR, E1.event_id, "held", "unknown-operation", age=2.0),
        Receipt(CURSOR, E2.event_id, "held", "unknown-operation", age=14.0),
        Receipt(CURSOR, E3.event_id, "quarantined", "unknown-operation", age=600.0),
    ]
    assert _rules(hold_violations(receipts, limit=13.0)) == {("holds", CURSOR, E2.event_id)}


def test_a_cursor_checkpoint_past_an_event_without_a_final_receipt_is_a_violation() -> None:
    checkpoint = Checkpoint(CURSOR, "cursor", applied_position=20)
    held = Receipt(CURSOR, E2.event_id, "held", "unknown-operation")
    assert _rules(passed_violations(checkpoint, EVENTS, [*_receipts(CURSOR, E1), held])) == {
        ("passed", CURSOR, E2.event_id),
        ("passed", CURSOR, CURSOR_BACKFILL.event_id),
    }
    # E3 (position 30) is not passed yet; the late backfill is exempt during the run only
    exempt = late(EVENTS, "cursor")
    assert passed_violations(checkpoint, EVENTS, _receipts(CURSOR, E1, E2), exempt) == []


def test_a_timestamp_checkpoint_past_an_event_without_a_final_receipt_is_a_violation() -> None:
    checkpoint = Checkpoint(TS, "timestamp", closed_through=100)
    receipts = _receipts(TS, E1, E2)
    assert passed_violations(checkpoint, EVENTS, receipts, late(EVENTS, "timestamp")) == []
    assert _rules(passed_violations(checkpoint, EVENTS, receipts)) == {
        ("passed", TS, TS_BACKFILL.event_id)
    }
    # a receipt on the other feed does not count
    assert passed_violations(checkpoint, [E1], _receipts(CURSOR, E1)) != []


def test_a_checkpoint_is_caught_up_at_what_its_feed_can_prove() -> None:
    assert caught_up(Checkpoint(CURSOR, "cursor", applied_position=40), EVENTS)
    assert not caught_up(Checkpoint(CURSOR, "cursor", applied_position=30), EVENTS)
    # the last timestamp (102) can be closed only by a later event: 101 is caught up
    assert caught_up(Checkpoint(TS, "timestamp", closed_through=101), EVENTS)
    assert not caught_up(Checkpoint(TS, "timestamp", closed_through=100), EVENTS)
    assert not caught_up(None, EVENTS)
    assert caught_up(None, [])


def test_the_readings_apply_the_rules_during_the_run_and_at_the_end() -> None:
    everything = [*_receipts(CURSOR, *EVENTS), *_receipts(TS, *EVENTS)]
    checkpoints = {
        CURSOR: Checkpoint(CURSOR, "cursor", applied_position=40),
        TS: Checkpoint(TS, "timestamp", closed_through=101),
    }
    done = Snapshot(EVENTS, checkpoints, everything)
    assert final_violations(done, FEED_KINDS, hold_limit=13.0) == []
    # mid-run: the timestamp feed closed 100 before its backfill arrived, and has not found
    # it yet (the cursor feed, for which it is the newest event, has)
    found = [r for r in everything if (r.feed, r.event_id) != (TS, TS_BACKFILL.event_id)]
    running = Snapshot(EVENTS, checkpoints, found)
    assert sample_violations(running, FEED_KINDS, hold_limit=13.0) == []
    assert _rules(final_violations(running, FEED_KINDS, hold_limit=13.0)) == {
        ("receipts", TS, TS_BACKFILL.event_id),
        ("passed", TS, TS_BACKFILL.event_id),
    }
    # the cursor feed passing its newest event without a receipt is seen at once
    unsettled = [r for r in everything if (r.feed, r.event_id) != (CURSOR, TS_BACKFILL.event_id)]
    assert _rules(
        sample_violations(Snapshot(EVENTS, checkpoints, unsettled), FEED_KINDS, 13.0)
    ) == {("passed", CURSOR, TS_BACKFILL.event_id)}
    # a hold outstaying its limit is seen during the run
    stale = [*everything, Receipt(TS, "evt_6", "held", "unknown-operation", age=20.0)]
    assert _rules(sample_violations(Snapshot(EVENTS, checkpoints, stale), FEED_KINDS, 13.0)) == {
        ("holds", TS, "evt_6")
    }
