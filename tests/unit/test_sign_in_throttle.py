"""The console's sign-in throttle (service.app.console.SignInThrottle) on a hand-moved clock:
fixed windows per address, refusals with the time left, successes given back, and a bounded
table of addresses."""

from __future__ import annotations

import pytest

from service.app import console
from service.app.console import SignInThrottle


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_address_past_its_attempts_waits_for_the_end_of_the_window() -> None:
    clock = Clock(1000.0)
    throttle = SignInThrottle(3, 60.0, clock=clock)
    assert [throttle.take("a") for _ in range(3)] == [None, None, None]
    clock.now = 1010.0
    assert throttle.take("a") == pytest.approx(10.0)  # the window is [960, 1020)
    assert throttle.take("b") is None  # another address counts alone
    clock.now = 1020.0
    assert throttle.take("a") is None  # a new window


def test_a_refused_attempt_is_not_counted_and_the_wait_is_at_least_a_second() -> None:
    clock = Clock(59.9)
    throttle = SignInThrottle(1, 60.0, clock=clock)
    assert throttle.take("a") is None
    assert throttle.take("a") == 1.0
    clock.now = 60.0
    assert throttle.take("a") is None


def test_a_success_gives_its_attempt_back() -> None:
    throttle = SignInThrottle(2, 60.0, clock=Clock())
    for _ in range(10):
        assert throttle.take("a") is None
        throttle.give_back("a")
    throttle.give_back("never-seen")  # nothing to give back: nothing happens
    assert throttle.take("a") is None and throttle.take("a") is None
    assert throttle.take("a") is not None


def test_the_table_of_addresses_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "MAX_TRACKED_ADDRESSES", 3)
    clock = Clock()
    throttle = SignInThrottle(1, 60.0, clock=clock)
    for address in ("a", "b", "c"):
        assert throttle.take(address) is None
    # past the table, a new address goes through uncounted; the counted ones stay refused
    assert throttle.take("d") is None and throttle.take("d") is None
    assert throttle.take("a") is not None
    clock.now += 60.0
    assert throttle.take("d") is None and throttle.take("d") is not None
