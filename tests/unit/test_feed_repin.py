"""Accepting a conflicting identity unpins for that one conflict (service/core/feed.py): a
page that passes the checks and serves the event of an unpinned receipt says to pin it again
at the place and content served; from then on a later conflict of the event stops a page
again. A page that stops, for whatever reason, pins nothing again."""

from __future__ import annotations

from service.core.feed import (
    CursorCheck,
    FeedEvent,
    ReceiptState,
    Seen,
    Stop,
    TimestampCheck,
    check_cursor_page,
    check_timestamp_page,
)

A, H = ReceiptState.APPLIED, ReceiptState.HELD


def test_a_page_that_passes_pins_an_unpinned_receipt_again_as_served() -> None:
    seen = {
        "blank": Seen(3, A, digest="d4", pinned=False),  # served without a digest: keeps d4
        "moved": Seen(5, A, digest="d1", pinned=False),  # settled: skipped, pinned again
        "kept": Seen(7, A, digest="d3"),  # pinned, served where it is: nothing to do
        "held": Seen(6, H, digest="d2", pinned=False),  # held: decided, and pinned again
    }
    page = [
        FeedEvent("kept", 7, "d3"),
        FeedEvent("blank", 8),
        FeedEvent("moved", 9, "d5"),
        FeedEvent("moved", 9, "d5"),  # the very same event twice: once
        FeedEvent("held", 10, "d6"),
        FeedEvent("new", 12, "d7"),
    ]
    again = [FeedEvent("blank", 8, "d4"), FeedEvent("moved", 9, "d5"), FeedEvent("held", 10, "d6")]
    process = [FeedEvent("held", 10, "d6"), FeedEvent("new", 12, "d7")]
    assert check_cursor_page(None, page, seen, {7: "kept"}) == CursorCheck(process, [], again)
    assert check_timestamp_page(2, page, seen) == TimestampCheck(process, [], again)


def test_once_pinned_again_a_later_conflict_stops_the_page_again() -> None:
    """The receipt as the store writes it from ``repin``: pinned at 9 with d5."""
    unpinned = {"a": Seen(5, A, digest="d1", pinned=False)}
    checked = check_cursor_page(None, [FeedEvent("a", 9, "d5")], unpinned, {})
    assert isinstance(checked, CursorCheck) and checked.repin == [FeedEvent("a", 9, "d5")]
    pinned = {"a": Seen(9, A, digest="d5")}
    for page in ([FeedEvent("a", 12, "d5")], [FeedEvent("a", 9, "d6")]):
        stop = check_cursor_page(None, page, pinned, {9: "a"})
        assert isinstance(stop, Stop) and stop.kind == "conflicting-identity", page
        stop = check_timestamp_page(4, page, pinned)
        assert isinstance(stop, Stop) and stop.kind == "conflicting-identity", page
    # served again as pinned: passes, and nothing to pin again
    assert check_cursor_page(None, [FeedEvent("a", 9, "d5")], pinned, {9: "a"}) == CursorCheck(
        [], []
    )


def test_a_page_that_stops_for_another_reason_pins_nothing_again() -> None:
    """The unpinned event comes first and passes, and then the page stops: no ``repin`` is
    returned at all (a :class:`Stop` has none)."""
    unpinned = {"a": Seen(5, A, digest="d1", pinned=False), "b": Seen(6, A, digest="d2")}
    first = FeedEvent("a", 9, "d5")
    stops = [
        check_cursor_page(None, [first, FeedEvent("z", 8)], unpinned, {}),  # regression
        check_cursor_page(None, [first, FeedEvent("b", 10, "d2")], unpinned, {}),  # b moved
        check_cursor_page(None, [first, FeedEvent("z", 10)], unpinned, {10: "b"}),  # taken
        check_cursor_page(None, [first, FeedEvent("a", 10, "d5")], unpinned, {}),  # twice
        check_timestamp_page(4, [first, FeedEvent("z", 8)], unpinned),
        check_timestamp_page(4, [first, FeedEvent("b", 6, "d9")], unpinned),  # b changed
        check_timestamp_page(4, [first, FeedEvent("a", 9, "d6")], unpinned),  # twice
    ]
    for stop in stops:
        assert isinstance(stop, Stop), stop
    # an unpinned receipt's event served at a place another pinned receipt holds: a stop
    taken = check_cursor_page(None, [FeedEvent("a", 6, "d1")], unpinned, {6: "b"})
    assert isinstance(taken, Stop) and taken.event_id == "a"
