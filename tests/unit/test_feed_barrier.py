"""The feed observer's barrier rules (service/core/feed.py): tables of pages, and a stateful
property test that drives random feeds, page sizes, overlaps, ties and crashes."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from service.core.feed import (
    Advance,
    Backoff,
    Blocked,
    CursorCheck,
    FeedEvent,
    Promote,
    ReceiptState,
    Seen,
    Stop,
    TimestampCheck,
    check_cursor_page,
    check_timestamp_page,
    closable_through,
    cursor_barrier,
    found_by,
    twice_in_one_page,
)

A, IGN, Q, H = (
    ReceiptState.APPLIED,
    ReceiptState.IGNORED,
    ReceiptState.QUARANTINED,
    ReceiptState.HELD,
)


def ev(event_id: str, order: int) -> FeedEvent:
    return FeedEvent(event_id, order)


# -- cursor feeds: the page check ------------------------------------------------------------


def test_final_states() -> None:
    assert [s.final for s in (A, IGN, Q, H)] == [True, True, True, False]


def test_a_fresh_page_is_processed_in_order() -> None:
    page = [ev("a", 1), ev("b", 2)]
    assert check_cursor_page(None, page, {}, {}) == CursorCheck(process=page, backfilled=[])


def test_overlap_with_final_receipts_is_skipped_and_a_held_one_is_retried() -> None:
    page = [ev("a", 104), ev("b", 106), ev("c", 107)]
    seen = {"a": Seen(104, A), "b": Seen(106, H)}
    checked = check_cursor_page(105, page, seen, {104: "a", 106: "b"})
    assert checked == CursorCheck(process=[ev("b", 106), ev("c", 107)], backfilled=[])


def test_an_unknown_event_behind_the_prefix_is_processed_and_reported() -> None:
    checked = check_cursor_page(105, [ev("x", 103), ev("c", 107)], {}, {})
    assert checked == CursorCheck(process=[ev("x", 103), ev("c", 107)], backfilled=[ev("x", 103)])


def test_positions_that_do_not_increase_stop_the_page() -> None:
    for page in ([ev("a", 5), ev("b", 5)], [ev("a", 5), ev("b", 4)]):
        stop = check_cursor_page(None, page, {}, {})
        assert isinstance(stop, Stop) and stop.kind == "regression" and stop.event_id == "b"


def test_an_event_that_moved_or_a_taken_position_is_a_conflicting_identity() -> None:
    moved = check_cursor_page(None, [ev("a", 7)], {"a": Seen(6, A)}, {})
    assert isinstance(moved, Stop) and moved.kind == "conflicting-identity"
    taken = check_cursor_page(None, [ev("z", 6)], {}, {6: "a"})
    assert isinstance(taken, Stop) and taken.kind == "conflicting-identity"
    assert "already holds event a" in taken.detail


def test_an_event_served_again_with_other_content_is_a_conflicting_identity() -> None:
    settled = {"a": Seen(5, A, digest="d1")}
    same = [FeedEvent("a", 5, "d1")]
    other = [FeedEvent("a", 5, "d2")]
    assert check_cursor_page(None, same, settled, {5: "a"}) == CursorCheck([], [])
    stop = check_cursor_page(None, other, settled, {5: "a"})
    assert isinstance(stop, Stop) and stop.kind == "conflicting-identity"
    assert check_timestamp_page(4, same, settled) == TimestampCheck([], [])
    stop = check_timestamp_page(4, other, settled)
    assert isinstance(stop, Stop) and stop.kind == "conflicting-identity"
    # a held event may come back changed (it is being retried); an unknown digest proves nothing
    held = {"a": Seen(5, H, digest="d1")}
    assert check_cursor_page(None, other, held, {5: "a"}) == CursorCheck(other, [])
    assert check_cursor_page(None, [FeedEvent("a", 5)], settled, {5: "a"}) == CursorCheck([], [])


def test_an_unpinned_receipt_holds_neither_its_place_nor_its_content() -> None:
    """An operator accepted a conflicting identity: the outcome stays (skipped as settled),
    but the feed's place and content for the event are taken as they come, and pinned
    again as served (tests/unit/test_feed_repin.py)."""
    unpinned = {"a": Seen(5, A, digest="d1", pinned=False)}
    moved_and_changed = [FeedEvent("a", 9, "d2")]
    repinned = moved_and_changed
    assert check_cursor_page(None, moved_and_changed, unpinned, {}) == CursorCheck([], [], repinned)
    assert check_timestamp_page(4, moved_and_changed, unpinned) == TimestampCheck([], [], repinned)
    # a stop says where the page served the event, for the operator's acceptance
    pinned = check_cursor_page(None, moved_and_changed, {"a": Seen(5, A, digest="d1")}, {})
    assert isinstance(pinned, Stop) and pinned.order == 9


def test_only_the_alarm_of_an_event_twice_in_one_page_is_told_apart() -> None:
    """The details a conflicting identity is alarmed with: only the one of an event twice in
    one page (as the observer or a walk alarms it) has no operator action, even when another
    event's id reads like it."""
    twice = check_cursor_page(None, [FeedEvent("x", 5, "d1"), FeedEvent("x", 6, "d1")], {}, {})
    tie = check_timestamp_page(None, [FeedEvent("x", 5, "d1"), FeedEvent("x", 5, "d2")], {})
    assert isinstance(twice, Stop) and isinstance(tie, Stop)
    for detail in (twice.detail, tie.detail, f"reconciliation: {twice.detail}"):
        assert twice_in_one_page(detail), detail
    for walk in ("reconciliation", "audit"):  # as a walk alarms it
        found = found_by(walk, twice)
        assert found.detail == f"{walk}: {twice.detail}" and twice_in_one_page(found.detail)
    owner = f"y: {twice.detail}"
    others = [
        check_cursor_page(None, [FeedEvent("a", 9, "d1")], {"a": Seen(5, A, "d1")}, {}),
        check_cursor_page(None, [FeedEvent("a", 9, "d1")], {}, {9: owner}),
        check_timestamp_page(None, [FeedEvent("a", 9, "d1")], {"a": Seen(5, A, "d1")}),
        check_timestamp_page(None, [FeedEvent("a", 5, "d2")], {"a": Seen(5, A, "d1")}),
    ]
    for other in others:
        assert isinstance(other, Stop) and other.kind == "conflicting-identity"
        assert not twice_in_one_page(other.detail), other.detail
        assert not twice_in_one_page(f"audit: {other.detail}"), other.detail


# -- cursor feeds: the barrier -----------------------------------------------------------------


def test_one_event_id_twice_in_a_page_is_a_conflict_unless_it_is_the_same_event() -> None:
    one, other = FeedEvent("x", 5, "d1"), FeedEvent("x", 6, "d1")
    stop = check_cursor_page(None, [one, other], {}, {})
    assert isinstance(stop, Stop) and stop.kind == "conflicting-identity"
    changed = FeedEvent("x", 5, "d2")
    for check in (
        lambda page: check_cursor_page(None, page, {}, {}),
        lambda page: check_timestamp_page(None, page, {}),
    ):
        stop = check([one, changed])
        assert isinstance(stop, Stop) and "other content" in stop.detail
        # the very same event twice at one place: processed once
        checked = check([one, one, FeedEvent("y", 7, "d3")])
        assert not isinstance(checked, Stop)
        assert [e.event_id for e in checked.process] == ["x", "y"]
    stop = check_timestamp_page(None, [one, FeedEvent("x", 9, "d1")], {})
    assert isinstance(stop, Stop) and "same content" in stop.detail


def test_the_cursor_is_promoted_only_when_every_event_is_final() -> None:
    page = [ev("a", 104), ev("b", 106), ev("c", 107)]
    half = {"a": A, "b": IGN}
    assert cursor_barrier("C7", "C8", 105, page, half, advance=True) == Blocked(["c"])
    held = {**half, "c": H}
    assert cursor_barrier("C7", "C8", 105, page, held, advance=True) == Blocked(["c"])
    done = {**half, "c": Q}
    assert cursor_barrier("C7", "C8", 105, page, done, advance=True) == Promote("C8", 107)
    # a held event behind the applied position (an overlap, a backfill) is already passed
    behind = {"a": H, "b": IGN, "c": Q}
    assert cursor_barrier("C7", "C8", 105, page, behind, advance=True) == Promote("C8", 107)


def test_the_applied_position_never_moves_back() -> None:
    assert cursor_barrier("C7", "C8", 105, [ev("a", 104)], {"a": A}, advance=True) == Promote(
        "C8", 105
    )
    assert cursor_barrier(
        "C7", "C8", 105, [ev("a", 103), ev("b", 105)], {"a": A, "b": A}, advance=True
    ) == (Promote("C8", 105))


def test_an_empty_page_with_a_new_cursor_is_adopted_but_is_not_progress() -> None:
    assert cursor_barrier("C7", "C8", 105, [], {}, advance=True) == Advance("C8")
    assert cursor_barrier("", "C1", None, [], {}, advance=True) == Advance("C1")


def test_a_new_cursor_on_an_empty_page_is_not_adopted_unless_the_source_documents_it() -> None:
    assert cursor_barrier("C7", "C8", 105, [], {}, advance=False) == Backoff()
    assert cursor_barrier("", "C1", None, [], {}, advance=False) == Backoff()
    # a page with events is promoted whatever the source says of empty pages
    assert cursor_barrier("C7", "C8", 105, [ev("a", 106)], {"a": A}, advance=False) == (
        Promote("C8", 106)
    )


def test_the_request_cursor_coming_back_is_a_backoff() -> None:
    assert cursor_barrier("C7", "C7", 105, [], {}, advance=True) == Backoff()
    assert cursor_barrier("C7", "C7", 105, [ev("a", 106)], {"a": A}, advance=True) == Backoff()


# -- timestamp feeds ---------------------------------------------------------------------------


def test_timestamp_pages_are_checked_like_cursor_pages() -> None:
    page = [ev("a", 10), ev("b", 10), ev("c", 11)]
    assert check_timestamp_page(9, page, {"a": Seen(10, A)}) == TimestampCheck(
        process=[ev("b", 10), ev("c", 11)], late=[]
    )
    back = check_timestamp_page(None, [ev("a", 11), ev("b", 10)], {})
    assert isinstance(back, Stop) and back.kind == "regression"
    moved = check_timestamp_page(None, [ev("a", 11)], {"a": Seen(10, A)})
    assert isinstance(moved, Stop) and moved.kind == "conflicting-identity"
    late = check_timestamp_page(10, [ev("x", 9), ev("a", 11)], {})
    assert late == TimestampCheck(process=[ev("x", 9), ev("a", 11)], late=[ev("x", 9)])


def test_the_worked_example_of_a_tie_group_across_pages() -> None:
    """10:00 closed; A and B at 10:01 fill a page; C at 10:01 and D at 10:02 follow."""
    first = [ev("A", 1001), ev("B", 1001)]
    # a full page of one group: nothing closes, whatever the watermark says
    assert closable_through(1000, first, {"A": A, "B": A}, 1005, full=True) is None
    whole = [*first, ev("C", 1001), ev("D", 1002)]
    assert closable_through(1000, whole, {"A": A, "B": A}, None, full=False) is None  # C open
    assert closable_through(1000, whole, {"A": A, "B": A, "C": IGN}, None, full=False) == 1001
    # D is durable too, but only a watermark (or a later event) proves 10:02 complete
    states = {"A": A, "B": A, "C": IGN, "D": A}
    assert closable_through(1000, whole, states, None, full=False) == 1001
    assert closable_through(1000, whole, states, 1002, full=False) == 1002
    assert closable_through(1000, whole, states, 1002, full=True) == 1001


def test_a_watermark_closes_an_empty_stretch_and_a_hold_keeps_it_open() -> None:
    assert closable_through(1000, [], {}, 1005, full=False) == 1005
    assert closable_through(1000, [], {}, 999, full=False) is None
    assert closable_through(None, [], {}, None, full=False) is None
    assert closable_through(None, [ev("a", 7)], {"a": H}, 9, full=False) == 6
    assert closable_through(6, [ev("a", 7)], {"a": H}, 9, full=False) is None


def test_only_the_promised_proofs_close_a_timestamp() -> None:
    page = [ev("a", 1001), ev("b", 1050)]
    done = {"a": A, "b": A}
    # a later timestamp only: what the page's order proves
    assert closable_through(1000, page, done, None, full=True) == 1049
    # a watermark only: all of it when the page is the whole answer...
    assert closable_through(1000, page, done, 5000, full=False, later=False) == 5000
    # ...but no further than the page's last timestamp when the page may be cut
    assert closable_through(1000, page, done, 5000, full=True, later=False) == 1049
    # neither: nothing closes; an empty page with a watermark closes through it
    assert closable_through(1000, page, done, None, full=False, later=False) is None
    assert closable_through(1000, [], {}, 5000, full=False, later=False) == 5000


def test_an_event_at_timestamp_zero_never_closes_the_feed_through_minus_one() -> None:
    assert closable_through(None, [ev("a", 0)], {"a": A}, None, full=False) is None
    assert closable_through(None, [ev("a", 0)], {"a": A}, None, full=True) is None
    assert closable_through(None, [ev("a", 0), ev("b", 1)], {"a": A, "b": A}, None, full=True) == 0


# -- a stateful property: random feeds, pages, ties and crashes --------------------------------


class CursorFeedMachine(RuleBasedStateMachine):
    """A feed appends events; an observer reads pages of random sizes, gives each event a
    receipt (sometimes a hold that an operator resolves later), may crash after any number
    of receipts, and promotes only through the barrier. Nothing is skipped or done twice."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[FeedEvent] = []
        self.receipts: dict[str, ReceiptState] = {}
        self.writes: dict[str, int] = {}
        self.cursor = 0  # the checkpoint: index into events of the next one to ask for
        self.applied: int | None = None

    @rule(n=st.integers(1, 5))
    def append(self, n: int) -> None:
        for _ in range(n):
            self.events.append(ev(f"e{len(self.events)}", 10 * (len(self.events) + 1)))

    @rule(
        size=st.integers(1, 6),
        overlap=st.integers(0, 3),
        crash_after=st.one_of(st.none(), st.integers(0, 6)),
        hold_every=st.integers(0, 4),
    )
    def page(self, size: int, overlap: int, crash_after: int | None, hold_every: int) -> None:
        start = max(0, self.cursor - overlap)
        page = self.events[start : self.cursor + size]
        next_index = self.cursor + len(self.events[self.cursor : self.cursor + size])
        request, next_token = f"c{self.cursor}", f"c{next_index}"
        seen = {
            e.event_id: Seen(e.order, self.receipts[e.event_id])
            for e in page
            if e.event_id in self.receipts
        }
        owners = {e.order: e.event_id for e in page if e.event_id in self.receipts}
        checked = check_cursor_page(self.applied, page, seen, owners)
        assert isinstance(checked, CursorCheck)
        assert not checked.backfilled
        for n, event in enumerate(checked.process):
            if crash_after is not None and n >= crash_after:
                return  # the process dies: what was written stays, nothing else happens
            if event.event_id in self.receipts:
                continue  # held: waits for the operator
            if hold_every and int(event.event_id[1:]) % hold_every == 0:
                self.receipts[event.event_id] = H
            else:
                self.receipts[event.event_id] = A
                self.writes[event.event_id] = self.writes.get(event.event_id, 0) + 1
        verdict = cursor_barrier(
            request, next_token, self.applied, page, dict(self.receipts), advance=True
        )
        if isinstance(verdict, Promote):
            self.cursor = next_index
            self.applied = verdict.applied_position
        elif isinstance(verdict, Advance):  # an empty page: its cursor, not progress
            assert not page
            self.cursor = next_index

    @precondition(lambda self: any(s is H for s in self.receipts.values()))
    @rule()
    def operator_resolves_holds(self) -> None:
        for event_id, state in self.receipts.items():
            if state is H:
                self.receipts[event_id] = Q

    @invariant()
    def nothing_is_passed_without_a_final_receipt(self) -> None:
        for event in self.events[: self.cursor]:
            assert self.receipts.get(event.event_id, H).final, event

    @invariant()
    def no_event_is_applied_twice(self) -> None:
        assert all(n <= 1 for n in self.writes.values()), self.writes

    @invariant()
    def the_applied_position_is_the_last_passed_event(self) -> None:
        if self.cursor:
            assert self.applied == self.events[self.cursor - 1].order


CursorFeedMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
TestCursorFeed = CursorFeedMachine.TestCase


class TimestampFeedMachine(RuleBasedStateMachine):
    """Events arrive with non-decreasing whole-second timestamps (many ties); the observer
    asks strictly after its closed timestamp with a page size that doubles while one tie
    group fills the page; crashes lose nothing. The closed timestamp never passes an event
    without a final receipt, and never moves back."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[FeedEvent] = []
        self.now = 100
        self.receipts: dict[str, ReceiptState] = {}
        self.closed: int | None = None
        self.limit = 2

    @rule(n=st.integers(1, 6), tick=st.integers(0, 2))
    def append(self, n: int, tick: int) -> None:
        self.now += tick
        for _ in range(n):
            self.events.append(ev(f"e{len(self.events)}", self.now))

    @rule(crash_after=st.one_of(st.none(), st.integers(0, 4)), watermark_lag=st.integers(0, 3))
    def page(self, crash_after: int | None, watermark_lag: int) -> None:
        after = self.closed if self.closed is not None else -1
        page = [e for e in self.events if e.order > after][: self.limit]
        # the feed promises nothing at or before its watermark will still come
        watermark = self.now - 1 - watermark_lag
        seen = {
            e.event_id: Seen(e.order, self.receipts[e.event_id])
            for e in page
            if e.event_id in self.receipts
        }
        checked = check_timestamp_page(self.closed, page, seen)
        assert isinstance(checked, TimestampCheck) and not checked.late
        for n, event in enumerate(checked.process):
            if crash_after is not None and n >= crash_after:
                self.limit = 2
                return
            self.receipts[event.event_id] = A
        full = len(page) >= self.limit
        through = closable_through(self.closed, page, dict(self.receipts), watermark, full=full)
        if through is None:
            if len(page) >= self.limit and len({e.order for e in page}) == 1:
                self.limit *= 2
            return
        assert self.closed is None or through > self.closed
        self.closed = through
        self.limit = 2

    @invariant()
    def nothing_at_or_before_the_closed_timestamp_lacks_a_receipt(self) -> None:
        if self.closed is None:
            return
        for event in self.events:
            if event.order <= self.closed:
                assert event.event_id in self.receipts, (event, self.closed)


TimestampFeedMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
TestTimestampFeed = TimestampFeedMachine.TestCase
