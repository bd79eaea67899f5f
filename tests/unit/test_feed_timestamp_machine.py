"""The timestamp feed procedure, end to end over the pure core (service/core/feed.py): a
stateful property test with two observers whose passes interleave, holds that are decided
again, pages that overlap, and events the source adds late behind the closed timestamp.

Only ``check_timestamp_page`` and ``closable_through`` are the service's; the rest (the
receipts table, the checkpoint and its CAS, the hold decisions, the source) is a small model
of the shell, kept here so that no database or I/O is needed."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from service.core.feed import (
    FeedEvent,
    ReceiptState,
    Seen,
    TimestampCheck,
    check_timestamp_page,
    closable_through,
)

A, IGN, Q, H = (
    ReceiptState.APPLIED,
    ReceiptState.IGNORED,
    ReceiptState.QUARANTINED,
    ReceiptState.HELD,
)

# an event about an unknown operation is held this many ticks, then quarantined
GRACE = 3
# the first page size: small, so that one tie group often fills a page and it doubles
PAGE_SIZE = 3
# the largest page the model asks for: far more than a generated feed holds at one timestamp
MAX_PAGE = 256
# how far behind the closed timestamp the audit reads again (seconds)
AUDIT_WINDOW = 4
# the operations the events are about; the first three are known from the start
OPS = ("o0", "o1", "o2", "o3", "o4")
OBSERVERS = ("A", "B")


@dataclass
class Receipt:
    """One row of the receipts table (unique per feed and event id)."""

    event_id: str
    order: int
    digest: str
    op: str
    state: ReceiptState
    first_seen: int  # the model's clock when the event was first given an outcome
    decided_at: int  # the model's clock when the outcome was last decided


@dataclass(frozen=True)
class Checkpoint:
    closed: int | None = None
    version: int = 0


@dataclass
class Pending:
    """A page an observer fetched, waiting for its ``close`` step; ``todo``: the events it
    has still to process (checked against the receipts as they were at the fetch)."""

    page: list[FeedEvent]
    watermark: int
    full: bool
    todo: list[FeedEvent]


@dataclass
class Observer:
    view: Checkpoint | None = None  # the checkpoint as this observer read it
    limit: int = PAGE_SIZE
    pending: Pending | None = None


class TimestampObserversMachine(RuleBasedStateMachine):
    """A source appends events with whole-second timestamps (many ties), about operations
    known or not yet known, and sometimes adds one late behind the closed timestamp. Two
    observers read the checkpoint, fetch and process a page (and may crash or pause midway),
    and close through a CAS on the version they read; holds are decided again by
    ``redrive``; an audit reads the window behind the closed timestamp again. No main event
    is passed without a final receipt, the checkpoint never moves back, an event has one
    receipt and a final one never changes, and a late event an audit page covered has a
    receipt."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 10  # the model clock (seconds); the source stamps events with it
        self.seq = 0
        self.feed: list[FeedEvent] = []  # the source's order: timestamp, then arrival
        self.op_of: dict[str, str] = {}
        self.late: set[str] = set()  # event ids added behind the closed timestamp
        self.known: set[str] = {"o0", "o1", "o2"}
        self.applied_by: dict[str, str] = {}  # operation -> the event that applied it
        self.table: list[Receipt] = []
        self.finals: dict[str, tuple[ReceiptState, str, int]] = {}  # as first seen final
        self.checkpoint = Checkpoint()
        self.last_checkpoint = self.checkpoint  # as the invariants last saw it
        self.observers = {name: Observer() for name in OBSERVERS}
        self.audited: set[str] = set()  # late event ids an audit page covered

    # -- the model of the shell ----------------------------------------------------------------

    def _receipt(self, event_id: str) -> Receipt | None:
        return next((r for r in self.table if r.event_id == event_id), None)

    def _seen(self, page: list[FeedEvent]) -> dict[str, Seen]:
        seen: dict[str, Seen] = {}
        for event in page:
            receipt = self._receipt(event.event_id)
            if receipt is not None:
                seen[event.event_id] = Seen(receipt.order, receipt.state, receipt.digest)
        return seen

    def _judge(self, event_id: str, op: str, first_seen: int) -> ReceiptState:
        """The outcome the service gives an event: the operation known settles it (a second
        event about an applied operation is a replay), the grace run out quarantines it,
        otherwise it stays held."""
        if op in self.known:
            return A if self.applied_by.setdefault(op, event_id) == event_id else IGN
        if self.now - first_seen >= GRACE:
            return Q
        return H

    def _decide(self, event: FeedEvent) -> None:
        """Give one event its outcome: the first writer inserts the receipt; a held one is
        decided again; a final one stays (a second insert loses on the unique key)."""
        op = self.op_of[event.event_id]
        receipt = self._receipt(event.event_id)
        if receipt is None:
            state = self._judge(event.event_id, op, self.now)
            self.table.append(
                Receipt(event.event_id, event.order, event.digest, op, state, self.now, self.now)
            )
        elif receipt.state is H:
            receipt.state = self._judge(event.event_id, op, receipt.first_seen)
            receipt.decided_at = self.now

    def _check(self, closed: int | None, events: list[FeedEvent]) -> TimestampCheck:
        """The core's page check, and what it must say of a page the model's source serves:
        no stop, every event without a final receipt processed in order, and as late exactly
        those without a receipt at or before the closed timestamp (only backfilled ones)."""
        seen = self._seen(events)
        checked = check_timestamp_page(closed, events, seen)
        assert isinstance(checked, TimestampCheck), checked
        assert checked.process == [
            e for e in events if e.event_id not in seen or not seen[e.event_id].state.final
        ]
        assert checked.late == [
            e for e in events if e.event_id not in seen and closed is not None and e.order <= closed
        ]
        assert {e.event_id for e in checked.late} <= self.late, checked.late
        return checked

    def _stale(self, name: str) -> bool:
        """Between two passes, with no view or an outdated one: a read is due."""
        observer = self.observers[name]
        return observer.pending is None and observer.view != self.checkpoint

    def _ready(self, name: str) -> bool:
        """It has read the checkpoint, and has no page waiting for its close step."""
        observer = self.observers[name]
        return observer.view is not None and observer.pending is None

    def _has_page(self, name: str) -> bool:
        return self.observers[name].pending is not None

    # -- the source ----------------------------------------------------------------------------

    @rule(ops=st.lists(st.sampled_from(OPS), max_size=4), tick=st.integers(0, 2))
    def append(self, ops: list[str], tick: int) -> None:
        """The clock ticks, then the source adds events at the new ``now`` (none: a tick)."""
        self.now += tick
        for op in ops:
            event_id = f"e{self.seq}"
            self.seq += 1
            self.op_of[event_id] = op
            self.feed.append(FeedEvent(event_id, self.now, f"{op}#{event_id}"))

    @precondition(lambda self: len(self.known) < len(OPS))
    @rule(data=st.data())
    def learn(self, data: st.DataObject) -> None:
        """An operation comes to be known here (its request arrived)."""
        self.known.add(data.draw(st.sampled_from([op for op in OPS if op not in self.known])))

    @precondition(lambda self: self.checkpoint.closed is not None)
    @rule(op=st.sampled_from(OPS), back=st.integers(0, 3))
    def backfill(self, op: str, back: int) -> None:
        """The source breaks its promises: an event at or before the closed timestamp."""
        closed = self.checkpoint.closed
        assert closed is not None
        at = max(0, closed - back)
        event_id = f"x{self.seq}"
        self.seq += 1
        self.op_of[event_id] = op
        self.late.add(event_id)
        place = sum(1 for e in self.feed if e.order <= at)  # served last of its tie group
        self.feed.insert(place, FeedEvent(event_id, at, f"{op}#{event_id}"))

    # -- holds ---------------------------------------------------------------------------------

    @precondition(lambda self: any(r.state is H for r in self.table))
    @rule()
    def redrive(self) -> None:
        """The holds decided again, whether or not the feed serves them again."""
        for receipt in self.table:
            if receipt.state is H:
                receipt.state = self._judge(receipt.event_id, receipt.op, receipt.first_seen)
                receipt.decided_at = self.now
        for receipt in self.table:
            if receipt.state is H:
                assert receipt.op not in self.known, receipt
                assert self.now - receipt.first_seen < GRACE, receipt

    # -- the observers -------------------------------------------------------------------------

    @initialize(history=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(OPS)), max_size=8))
    def start(self, history: list[tuple[int, str]]) -> None:
        """The feed already holds some events (the clock ticking between them, or not: ties)
        when both observers read the checkpoint for the first time."""
        for tick, op in history:
            self.append([op], tick)
        for observer in self.observers.values():
            observer.view = self.checkpoint

    @precondition(lambda self: any(self._stale(name) for name in OBSERVERS))
    @rule(data=st.data())
    def read_checkpoint(self, data: st.DataObject) -> None:
        """A pass begins with the shared checkpoint read again (after a crash, or once the
        other observer moved it; a stale view is also fine: its close loses the CAS)."""
        name = data.draw(st.sampled_from([n for n in OBSERVERS if self._stale(n)]))
        self.observers[name].view = self.checkpoint

    @precondition(lambda self: any(self._ready(name) for name in OBSERVERS))
    @rule(
        data=st.data(),
        overlap=st.integers(0, 2),
        watermark_lag=st.integers(0, 2),
        crash_after=st.one_of(st.none(), st.integers(0, 3)),
        pause_after=st.one_of(st.none(), st.integers(0, 3)),
    )
    def fetch_and_process(
        self,
        data: st.DataObject,
        overlap: int,
        watermark_lag: int,
        crash_after: int | None,
        pause_after: int | None,
    ) -> None:
        """The page after the observer's closed timestamp, checked against the receipts as
        they are now; then its receipts one at a time (each its own transaction). After
        ``crash_after`` of them the process dies: what it wrote stays, its view, page and page
        size are lost. After ``pause_after`` of them it pauses: the rest are written in its
        close step, whatever was decided meanwhile."""
        name = data.draw(st.sampled_from([n for n in OBSERVERS if self._ready(n)]))
        observer = self.observers[name]
        assert observer.view is not None
        closed = observer.view.closed
        after = closed if closed is not None else -1
        # strictly after its closed timestamp, the page may start with already served events
        # (an inclusive ``after``, an overlapping page); they count against the limit
        behind = [e for e in self.feed if e.order <= after]
        served = behind[len(behind) - overlap :] if overlap else []
        page = [*served, *(e for e in self.feed if e.order > after)][: observer.limit]
        # the source keeps its watermark for the main sequence: events come at ``now`` or later
        watermark = self.now - 1 - watermark_lag
        checked = self._check(closed, page)
        full = len(page) >= observer.limit
        todo = list(checked.process)
        for n in range(len(todo)):
            if crash_after is not None and n >= crash_after:
                self.observers[name] = Observer()  # the process dies
                return
            if pause_after is not None and n >= pause_after:
                break
            self._decide(todo.pop(0))
        observer.pending = Pending(page, watermark, full, todo)

    @precondition(lambda self: any(self._has_page(name) for name in OBSERVERS))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        """The pass ends: what the page proves closed (with the receipts as they are now), by
        a CAS on the version the observer read; a lost CAS makes it read the checkpoint. A
        page that closes nothing and is one tie group doubles the observer's page size."""
        name = data.draw(st.sampled_from([n for n in OBSERVERS if self._has_page(n)]))
        observer = self.observers[name]
        view, pending = observer.view, observer.pending
        assert view is not None and pending is not None
        observer.pending = None
        for event in pending.todo:  # a paused page: its last receipts first
            self._decide(event)
        # the shared receipts as they are now (another observer or a redrive may have decided)
        states = {event_id: s.state for event_id, s in self._seen(pending.page).items()}
        # as the observer does: only the events after the closed timestamp decide what closes
        # (a hold behind it, served again by an overlap, blocks nothing ahead of it); a page
        # that may be cut and holds none of them proves nothing
        ahead = [e for e in pending.page if view.closed is None or e.order > view.closed]
        through = (
            None
            if pending.full and not ahead
            else closable_through(view.closed, ahead, states, pending.watermark, full=pending.full)
        )
        if through is None:
            # only the events after the closed timestamp say whether one tie group fills it
            fresh = {e.order for e in ahead}
            if pending.full and len(fresh) <= 1:
                observer.limit = min(MAX_PAGE, observer.limit * 2)
            return
        assert view.closed is None or through > view.closed
        if self.checkpoint.version == view.version:
            self.checkpoint = Checkpoint(through, view.version + 1)
        # won, the observer holds the new checkpoint; lost, it reads the other's
        observer.view = self.checkpoint
        observer.limit = PAGE_SIZE

    @precondition(
        lambda self: any(
            o.view is not None and o.view.closed is not None for o in self.observers.values()
        )
    )
    @rule(data=st.data())
    def audit(self, data: st.DataObject) -> None:
        """A page of the late-event audit: the window behind the observer's closed timestamp
        read again; whatever the check gives to process is processed."""
        ready = [n for n, o in self.observers.items() if o.view and o.view.closed is not None]
        view = self.observers[data.draw(st.sampled_from(ready))].view
        assert view is not None and view.closed is not None
        after = max(-1, view.closed - AUDIT_WINDOW - 1)
        events = [e for e in self.feed if after < e.order <= view.closed]
        for event in self._check(view.closed, events).process:
            self._decide(event)
        self.audited |= {e.event_id for e in events} & self.late

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def the_closed_timestamp_never_moves_back(self) -> None:
        before, now = self.last_checkpoint, self.checkpoint
        assert now.version >= before.version, (before, now)
        if before.closed is not None:
            assert now.closed is not None and now.closed >= before.closed, (before, now)
        self.last_checkpoint = now

    @invariant()
    def no_main_event_at_or_before_the_closed_timestamp_lacks_a_final_receipt(self) -> None:
        closed = self.checkpoint.closed
        if closed is None:
            return
        for event in self.feed:
            if event.order <= closed and event.event_id not in self.late:
                receipt = self._receipt(event.event_id)
                assert receipt is not None and receipt.state.final, (event, receipt, closed)

    @invariant()
    def one_receipt_per_event_and_a_final_one_never_changes(self) -> None:
        ids = [r.event_id for r in self.table]
        assert len(ids) == len(set(ids)), ids
        for receipt in self.table:
            final = self.finals.get(receipt.event_id)
            if final is not None:
                assert (receipt.state, receipt.digest, receipt.order) == final, receipt
            elif receipt.state.final:
                self.finals[receipt.event_id] = (receipt.state, receipt.digest, receipt.order)

    @invariant()
    def a_hold_waits_only_within_its_grace(self) -> None:
        for receipt in self.table:
            if receipt.state is H:
                assert receipt.first_seen <= receipt.decided_at <= self.now, receipt
                assert receipt.decided_at - receipt.first_seen < GRACE, receipt

    @invariant()
    def an_operation_is_applied_by_one_event_at_most(self) -> None:
        applied = [r.op for r in self.table if r.state is A]
        assert len(applied) == len(set(applied)), applied

    @invariant()
    def a_late_event_an_audit_covered_has_a_receipt(self) -> None:
        for event_id in self.audited:
            assert self._receipt(event_id) is not None, event_id

    @invariant()
    def an_observer_never_sees_a_checkpoint_ahead_of_the_shared_one(self) -> None:
        for observer in self.observers.values():
            if observer.view is not None:
                assert observer.view.version <= self.checkpoint.version
                if observer.view.version == self.checkpoint.version:
                    assert observer.view == self.checkpoint


TimestampObserversMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None
)
TestTimestampObservers = TimestampObserversMachine.TestCase
