"""The stalled-feed rule (service.app.feed_stalls.stall_of): behind a hold as long as the
hold is old; behind an unknown only while the feed has not moved; flagged past the setting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.app.feed_stalls import since_progress, stall_of

HOLD = ("evt-7", "bad-signature", 2520.0)


def test_a_hold_older_than_the_setting_flags_the_feed_behind_it() -> None:
    stall = stall_of("p", oldest_hold=HOLD, oldest_unknown=None, since_progress=10.0, after=900)
    assert stall.flagged and stall.seconds == 2520.0
    assert stall.behind == "hold evt-7 (bad-signature)"


def test_a_young_hold_is_no_stall_yet() -> None:
    young = ("evt-7", "bad-signature", 60.0)
    stall = stall_of("p", oldest_hold=young, oldest_unknown=None, since_progress=None, after=900)
    assert not stall.flagged and stall.seconds == 60.0


def test_a_feed_still_moving_is_not_stalled_behind_an_old_unknown() -> None:
    stall = stall_of("p", oldest_hold=None, oldest_unknown=7200.0, since_progress=30.0, after=900)
    assert not stall.flagged and stall.seconds == 30.0


def test_a_feed_that_stopped_moving_is_stalled_behind_an_unknown_since_it_stopped() -> None:
    stall = stall_of("p", oldest_hold=None, oldest_unknown=7200.0, since_progress=3000.0, after=900)
    assert stall.flagged and stall.seconds == 3000.0
    assert stall.behind == "the external operation unknown the longest"
    assert stall.unknown_for == 7200.0
    stall = stall_of("p", oldest_hold=None, oldest_unknown=1000.0, since_progress=None, after=900)
    assert stall.flagged and stall.seconds == 1000.0


def test_the_longer_of_the_two_is_the_stall() -> None:
    stall = stall_of("p", oldest_hold=HOLD, oldest_unknown=9000.0, since_progress=5000.0, after=900)
    assert stall.seconds == 5000.0 and stall.behind.startswith("the external operation")
    stall = stall_of("p", oldest_hold=HOLD, oldest_unknown=9000.0, since_progress=100.0, after=900)
    assert stall.seconds == 2520.0 and stall.behind.startswith("hold")
    assert stall.unknown_for is None


def test_nothing_blocking_or_no_setting_flags_nothing() -> None:
    idle = stall_of("p", oldest_hold=None, oldest_unknown=None, since_progress=9e9, after=900)
    assert not idle.flagged and idle.seconds == 0.0 and idle.behind == ""
    unset = stall_of("p", oldest_hold=HOLD, oldest_unknown=None, since_progress=None, after=None)
    assert not unset.flagged


def test_progress_is_the_checkpoints_move_or_reading_the_source_to_its_end() -> None:
    """An idle feed, caught up at every poll, makes progress though its checkpoint stays:
    one unknown payout its source never carries does not flag it (review T M4)."""
    moved = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
    caught_up = moved + timedelta(minutes=29)
    now = (moved + timedelta(minutes=30)).timestamp()
    assert since_progress(moved, caught_up, now) == 60.0
    assert since_progress(moved, None, now) == 1800.0
    assert since_progress(caught_up, moved, now) == 60.0  # whichever is later
    idle = stall_of(
        "payments",
        oldest_hold=None,
        oldest_unknown=3600.0,
        since_progress=since_progress(moved, caught_up, now),
        after=900.0,
    )
    assert not idle.flagged and idle.seconds == 60.0
