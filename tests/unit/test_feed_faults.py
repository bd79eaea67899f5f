"""The feed fault queue: the earliest armed entry that concerns a page and applies to it is
the one used; an entry that does not apply stays armed; one unit is consumed at a time."""

from __future__ import annotations

import pytest

from devstack.provider.faults import (
    MAX_FAULT_ENTRIES,
    FaultError,
    FeedFault,
    FeedFaultMode,
    FeedFaultQueue,
    FeedFaultRequest,
)

OVERLAP, STUCK, TIE = FeedFaultMode.OVERLAP, FeedFaultMode.STUCK_TOKEN, FeedFaultMode.BIG_TIE
PAGE_MODES = frozenset({OVERLAP, STUCK})


def queue(*entries: tuple[FeedFaultMode, int]) -> FeedFaultQueue:
    faults = FeedFaultQueue()
    for mode, count in entries:
        faults.arm(FeedFaultRequest(mode=mode, count=count))
    return faults


def test_the_earliest_entry_that_applies_is_chosen_and_nothing_is_consumed() -> None:
    faults = queue((TIE, 1), (OVERLAP, 2), (STUCK, 1))
    attempts: list[FeedFaultMode] = []

    def attempt(mode: FeedFaultMode) -> str | None:
        attempts.append(mode)
        return "page" if mode is STUCK else None  # overlap does not apply to this page

    assert faults.first(PAGE_MODES, attempt) == (2, STUCK, "page")
    assert attempts == [OVERLAP, STUCK]  # the tie concerns commits, not pages
    assert faults.armed() == [FeedFault(TIE, 1), FeedFault(OVERLAP, 2), FeedFault(STUCK, 1)]


def test_a_mode_that_does_not_apply_is_attempted_once() -> None:
    faults = queue((OVERLAP, 1), (OVERLAP, 1), (STUCK, 1))
    attempts: list[FeedFaultMode] = []

    def attempt(mode: FeedFaultMode) -> str | None:
        attempts.append(mode)
        return None

    assert faults.first(PAGE_MODES, attempt) is None
    assert attempts == [OVERLAP, STUCK]


def test_consume_takes_one_unit_and_says_when_the_entry_is_spent() -> None:
    faults = queue((OVERLAP, 2), (STUCK, 1))

    assert faults.consume(0) is False
    assert faults.armed() == [FeedFault(OVERLAP, 1), FeedFault(STUCK, 1)]
    assert faults.consume(1) is True
    assert faults.consume(0) is True
    assert faults.armed() == []


def test_arming_is_bounded_and_clear_empties_the_queue() -> None:
    faults = queue(*[(OVERLAP, 1)] * MAX_FAULT_ENTRIES)

    with pytest.raises(FaultError):
        faults.arm(FeedFaultRequest(mode=STUCK, count=1))
    faults.clear()
    assert faults.armed() == []
