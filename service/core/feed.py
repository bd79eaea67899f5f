"""The feed observer's barrier rules (docs/design.md §8), pure: pages and receipts in, a
verdict out.

A provider feed serves events, each with signed evidence of one operation's outcome. The
observer gives every event exactly one durable outcome (a *receipt*: applied, ignored as a
replay, or quarantined; a *hold* is durable but not final) and moves its checkpoint only past
events that have a final receipt.

Opaque-cursor feeds (:func:`check_cursor_page`, :func:`cursor_barrier`):

1. A page's positions must strictly increase, and an event identity keeps its position and
   its content, across pages and within one: a page that breaks either (a regression, a
   conflicting identity) stops the attempt; the checkpoint stays. An operator who reviewed a
   conflicting identity may accept it: the receipts involved are unpinned (their outcome
   stays; their place and content are no longer held against the feed) and the page passes.
   The unpinning is for that one conflict: a page that passes the checks and serves the
   event of an unpinned receipt pins it again at the place and content served (``repin``),
   so a later conflict of that event stops a page again.
   An event twice in one page is not accepted (:func:`twice_in_one_page` tells its alarm
   apart): no receipt holds it against the feed, only the source serving the page in order.
2. Events at or below the applied position are overlap. A known one is skipped; an unknown
   one (a backfill) is processed like any other, and alarmed: never skipped.
3. The returned cursor is promoted only when every event of the page ahead of the applied
   position has a final receipt (a held one behind it is already passed: its hold is
   decided again on its own, never forgotten).
   A cursor equal to the request's is not progress: back off. Nor is an empty page with a
   new cursor, whatever its token says (a source that hands out a fresh token on every
   empty page would otherwise be asked in a loop): when the source documents such tokens
   (``advance``), the new cursor is adopted without moving the checkpoint's version;
   otherwise it is not trusted (it might resume past events not yet visible) and the
   request's cursor is kept. Either way the observer backs off as on a caught-up feed.

Timestamp feeds (:func:`check_timestamp_page`, :func:`closable_through`): the checkpoint is
the timestamp through which every event is known and final; the next query asks strictly
after it. A timestamp ``t`` is complete once the page shows an event strictly later than
``t`` or the feed's finality watermark is at or past ``t``; it closes when it is complete and
every event at or before it has a final receipt. A page filled by one tie group closes
nothing and asks for a larger page; when the largest page cannot hold the group, the tie
stalls (an alarm), and nothing is skipped.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence

import msgspec

__all__ = [
    "Advance",
    "Backoff",
    "Blocked",
    "CursorCheck",
    "FeedEvent",
    "Promote",
    "ReceiptState",
    "Seen",
    "Stop",
    "TimestampCheck",
    "check_cursor_page",
    "check_timestamp_page",
    "closable_through",
    "cursor_barrier",
    "found_by",
    "twice_in_one_page",
]

# How the detail of a conflicting identity met twice in one page begins (see
# :func:`twice_in_one_page`).
TWICE_IN_ONE_PAGE = "served twice in one page"
# that detail as alarmed, behind the name a walk puts in front (:func:`found_by`) if any
_TWICE_ALARMED = re.compile(rf"(?:[a-z]+: )?{re.escape(TWICE_IN_ONE_PAGE)}: ")


class ReceiptState(enum.StrEnum):
    APPLIED = "applied"
    IGNORED = "ignored"
    QUARANTINED = "quarantined"
    HELD = "held"

    @property
    def final(self) -> bool:
        return self is not ReceiptState.HELD


class FeedEvent(msgspec.Struct, frozen=True):
    """An event as the barrier sees it: its identity, its place in the feed's order (a
    position for cursor feeds, a timestamp for timestamp feeds) and a digest of its content."""

    event_id: str
    order: int
    digest: str = ""


class Seen(msgspec.Struct, frozen=True):
    """What the receipts say of an event already met: where it was, its state, and the
    digest of its content when it was settled. ``pinned`` False: an operator accepted a
    conflicting identity of the event after review, so neither its place nor its content
    is held against what the feed serves now (its outcome stays), until a page that passes
    the checks serves it: then it is pinned again as served (the checks' ``repin``)."""

    order: int
    state: ReceiptState
    digest: str = ""
    pinned: bool = True


class Stop(msgspec.Struct, frozen=True):
    """The page breaks the feed's contract: nothing is promoted; alarm ``kind``. ``order``:
    where the page served the event (an operator accepting a conflicting identity unpins
    the receipt that holds that place too)."""

    kind: str
    event_id: str
    detail: str
    order: int | None = None


class CursorCheck(msgspec.Struct, frozen=True):
    """The events of the page to process (in order), the backfilled ones to alarm, and the
    unpinned receipts to pin again (see :func:`_repin`)."""

    process: list[FeedEvent]
    backfilled: list[FeedEvent]
    repin: list[FeedEvent] = []


def check_cursor_page(
    applied_position: int | None,
    events: Sequence[FeedEvent],
    seen: Mapping[str, Seen],
    position_owners: Mapping[int, str],
) -> CursorCheck | Stop:
    """``seen``: receipts of this page's event ids; ``position_owners``: the event id each
    of this page's positions has a receipt under."""
    previous: int | None = None
    process: list[FeedEvent] = []
    backfilled: list[FeedEvent] = []
    repin: list[FeedEvent] = []
    in_page: dict[str, FeedEvent] = {}
    for event in events:
        twice = _twice_in_page(in_page, event)
        if isinstance(twice, Stop):
            return twice
        if twice:
            continue  # the same event again, at the same place: processed once
        if previous is not None and event.order <= previous:
            return Stop(
                "regression",
                event.event_id,
                f"position {event.order} after {previous} in one page",
            )
        previous = event.order
        known = seen.get(event.event_id)
        owner = position_owners.get(event.order)
        if known is not None and known.pinned and known.order != event.order:
            return Stop(
                "conflicting-identity",
                event.event_id,
                f"event seen at position {known.order}, now at {event.order}",
                event.order,
            )
        if owner is not None and owner != event.event_id:
            return Stop(
                "conflicting-identity",
                event.event_id,
                f"position {event.order} already holds event {owner}",
                event.order,
            )
        _repin(repin, known, event)
        if known is not None and known.state.final:
            changed = _changed(known, event)
            if changed is not None:
                return changed
            continue  # overlap: already settled for good
        if known is None and applied_position is not None and event.order <= applied_position:
            backfilled.append(event)
        process.append(event)
    return CursorCheck(process=process, backfilled=backfilled, repin=repin)


class Promote(msgspec.Struct, frozen=True):
    """Move the checkpoint to ``cursor``, with ``applied_position``."""

    cursor: str
    applied_position: int | None


class Blocked(msgspec.Struct, frozen=True):
    """Events without a final receipt hold the barrier closed."""

    event_ids: list[str]


class Backoff(msgspec.Struct, frozen=True):
    """The feed returned the request's own cursor: nothing to promote; wait before asking."""


class Advance(msgspec.Struct, frozen=True):
    """An empty page with a new cursor: adopt ``cursor`` (no event was passed), but it is not
    progress: the checkpoint's version stays and the observer waits before asking again."""

    cursor: str


def cursor_barrier(
    request_cursor: str,
    next_cursor: str,
    applied_position: int | None,
    events: Sequence[FeedEvent],
    states: Mapping[str, ReceiptState],
    *,
    advance: bool,
) -> Promote | Advance | Blocked | Backoff:
    """``states``: the receipts of the page's events after processing; ``advance``: the
    source documents a new cursor on an empty page (else such a cursor is not adopted).
    Only events ahead of the applied position hold the barrier: a held event behind it (an
    overlap or a backfill) is already passed, and is decided again on its own."""
    open_ = [
        e.event_id
        for e in events
        if not _final(states.get(e.event_id))
        and (applied_position is None or e.order > applied_position)
    ]
    if open_:
        return Blocked(open_)
    if next_cursor == request_cursor:
        return Backoff()
    if not events:
        return Advance(next_cursor) if advance else Backoff()
    highest = max((e.order for e in events), default=None)
    if applied_position is not None and (highest is None or highest < applied_position):
        highest = applied_position
    return Promote(cursor=next_cursor, applied_position=highest)


class TimestampCheck(msgspec.Struct, frozen=True):
    process: list[FeedEvent]
    late: list[FeedEvent]
    """unknown events at or before the closed timestamp: processed, and alarmed"""
    repin: list[FeedEvent] = []
    """unpinned receipts to pin again (see :func:`_repin`)"""


def check_timestamp_page(
    closed_through: int | None, events: Sequence[FeedEvent], seen: Mapping[str, Seen]
) -> TimestampCheck | Stop:
    previous: int | None = None
    process: list[FeedEvent] = []
    late: list[FeedEvent] = []
    repin: list[FeedEvent] = []
    in_page: dict[str, FeedEvent] = {}
    for event in events:
        twice = _twice_in_page(in_page, event)
        if isinstance(twice, Stop):
            return twice
        if twice:
            continue  # the same event again, at the same place: processed once
        if previous is not None and event.order < previous:
            return Stop(
                "regression",
                event.event_id,
                f"timestamp {event.order} after {previous} in one page",
            )
        previous = event.order
        known = seen.get(event.event_id)
        if known is not None and known.pinned and known.order != event.order:
            return Stop(
                "conflicting-identity",
                event.event_id,
                f"event seen at timestamp {known.order}, now at {event.order}",
                event.order,
            )
        _repin(repin, known, event)
        if known is not None and known.state.final:
            changed = _changed(known, event)
            if changed is not None:
                return changed
            continue
        if known is None and closed_through is not None and event.order <= closed_through:
            late.append(event)
        process.append(event)
    return TimestampCheck(process=process, late=late, repin=repin)


def closable_through(
    closed_through: int | None,
    events: Sequence[FeedEvent],
    states: Mapping[str, ReceiptState],
    watermark: int | None,
    *,
    full: bool,
    later: bool = True,
) -> int | None:
    """The new closed-through timestamp, or None when it does not move.

    ``events`` is the page: the events the feed has strictly after ``closed_through``, in
    order. The proofs are only those the source promises: ``later`` (an event at a later
    timestamp proves every earlier one was served) and ``watermark`` (None when not
    promised: no event at or below it appears later). ``full``: the page may be cut (it
    filled the limit, or the source does not promise that a short page is the whole
    answer), so even the watermark proves nothing at or past its last timestamp."""
    proofs: list[int] = []
    if not events:
        if watermark is not None:
            proofs.append(watermark)  # nothing after the closed timestamp now, none later
    else:
        last = max(e.order for e in events)
        if later:
            proofs.append(last - 1)
        if watermark is not None:
            proofs.append(min(watermark, last - 1) if full else watermark)
    if not proofs:
        return None
    complete = max(proofs)
    unsettled = [e.order for e in events if not _final(states.get(e.event_id))]
    bound = complete if not unsettled else min(complete, min(unsettled) - 1)
    if bound < 0 or (closed_through is not None and bound <= closed_through):
        return None  # nothing is before timestamp 0: never closed through -1
    return bound


def _twice_in_page(in_page: dict[str, FeedEvent], event: FeedEvent) -> Stop | bool:
    """An event id met earlier in the same page: at another place or with other content it
    is a conflicting identity (which of the two is the event?); the very same event again is
    a duplicate to skip (True); False: met for the first time."""
    first = in_page.get(event.event_id)
    if first is None:
        in_page[event.event_id] = event
        return False
    if first.order != event.order or first.digest != event.digest:
        return Stop(
            "conflicting-identity",
            event.event_id,
            f"{TWICE_IN_ONE_PAGE}: at {first.order} and at {event.order}, "
            + ("with other content" if first.digest != event.digest else "with the same content"),
            event.order,
        )
    return True


def found_by(walk: str, stop: Stop) -> Stop:
    """``stop`` as a walk behind the checkpoint found it (``walk``: a lower-case name such as
    ``reconciliation``): its detail begins with the walk's name, which
    :func:`twice_in_one_page` reads past."""
    return msgspec.structs.replace(stop, detail=f"{walk}: {stop.detail}")


def twice_in_one_page(detail: str) -> bool:
    """Whether a ``conflicting-identity`` alarm's ``detail`` is the one
    :func:`_twice_in_page` stops a page with (an observer's walk puts its name in front).
    Such an alarm has no operator action: the stop holds no receipt against the feed, so
    unpinning one changes nothing; the feed resumes once the source serves the page in
    order. The other details begin otherwise (an event id is never at their start)."""
    return _TWICE_ALARMED.match(detail) is not None


def _repin(repin: list[FeedEvent], known: Seen | None, event: FeedEvent) -> None:
    """An unpinned receipt's event served where nothing in the page so far conflicts with
    it: pin it again at the place and content served (its old digest when none is served).
    The page's check returns the list only when the whole page passes: a page that stops,
    for whatever reason, pins nothing again."""
    if known is not None and not known.pinned:
        repin.append(FeedEvent(event.event_id, event.order, event.digest or known.digest))


def _changed(known: Seen, event: FeedEvent) -> Stop | None:
    """A final receipt's event served again with other content: a conflicting identity."""
    if (
        known.state.final
        and known.pinned
        and known.digest
        and event.digest
        and known.digest != event.digest
    ):
        return Stop(
            "conflicting-identity",
            event.event_id,
            "event served again with other content than the one settled",
            event.order,
        )
    return None


def _final(state: ReceiptState | None) -> bool:
    return state is not None and state.final
