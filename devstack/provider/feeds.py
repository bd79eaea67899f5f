"""The simulator's two event feeds: one event per payment it commits or declines.

Every committed payment is an event. The event carries the payment's signed evidence exactly
as the payment's answer does: ``evidence`` (the :class:`service.evidence.Evidence` object as
JSON, the same bytes) and ``signature`` (64 lower-case hex digits), together a
:class:`service.evidence.SignedEvidence`. ``event_id`` is ``"evt_"`` followed by the
payment's reference (``evt_pay_<24 hex>``): one per payment, never reused.

Order. At commit a payment gets a ``position`` (the highest so far plus ``POSITION_STEP``,
so positions grow in commit order and leave room between them) and a ``timestamp``, the
whole Unix second of the commit, never less than any earlier commit's or than a watermark
already served (so a clock stepping back cannot break either promise). Both are stored with
the payment and survive a restart.

``GET /feeds/cursor?cursor=<token, default "">&limit=<1..500, default 100>`` answers 200
``{"events": [{event_id, position, evidence, signature}], "next_cursor": <token>}``: the
events with a position strictly above the cursor's, ascending, at most ``limit``.
``next_cursor`` is the token of the last event's position; on an empty page it is the
request's cursor string, unchanged. Tokens are opaque (:mod:`devstack.provider.cursors`):
deterministic, not numbers, not comparable; ``""`` is the start (position 0). A cursor
that is malformed or not issued by this simulator's secret is 400 ``{"error": ...}``.

``GET /feeds/timestamp?after=<Unix seconds, optional>&limit=<1..500, default 100>`` answers
200 ``{"events": [{event_id, timestamp, evidence, signature}], "finality_watermark": W}``:
the events with a timestamp strictly above ``after`` (every event without it), ordered by
timestamp then position, at most ``limit``; a group of equal timestamps larger than
``limit`` is cut (ask again with a larger limit). ``W`` promises that no event with a
timestamp at or below it will appear later: the current second minus 1, raised to the
highest timestamp given minus 1 if the clock is behind it, and held below the pinned
timestamp while a ``big_tie`` is in progress; null only if that would be negative. The page
and ``W`` are read in one transaction that holds the store's write lock, and a commit reads
the clock inside its own, so a commit in progress in the current second is either in the page
or gets a timestamp above ``W``.

On either feed, ``limit`` must be 1 to 500 digits-only, ``after`` 0 or more (at most 12
digits), each parameter given at most once; otherwise 400 ``{"error": ...}``.

Misbehaviour for tests: ``POST /_sim/feed-faults {"mode", "count"}`` (``count`` 1 to
``MAX_FAULT_COUNT``) arms ``count`` units of one mode; ``GET`` lists what is left, ``DELETE``
clears everything (and ends a ``big_tie`` in progress). A page (or a commit, for the two tie
modes) takes the earliest armed entry whose mode concerns it and applies to it right then,
one fault per page, and consumes one unit of it; an entry that does not apply stays armed
and later entries may be used first. Overlap and conflict entries are extra, so such a page
may hold more than ``limit`` events. The modes:

- ``overlap`` (both feeds): the page also starts with up to ``OVERLAP_EVENTS`` (3) events
  already served, the last ones at or below the cursor's position (at or below ``after``),
  unchanged. ``next_cursor`` and ``W`` are as without the fault. Applies when such events
  exist (never from the start).
- ``backfill`` (both feeds): a new declined payment for a fresh operation (beneficiary
  ``FEED BACKFILL``, amount 1 EUR, properly signed evidence) is committed behind what was
  served. Cursor feed: at a free position strictly between the two highest positions at or
  below the cursor's that have room (0 counting as the lowest), timestamped as a commit
  then would be; applies when the cursor is not the start and such a gap exists among the
  last 64 positions. Timestamp feed: with the next position and the timestamp
  ``min(after, W)``; applies when ``after`` is given and at most ``BACKFILL_REACH`` (60) s
  behind ``W`` (a backfill lands shortly behind what was served, not behind a page that
  reads far back, such as an observer's audit). The page itself is served normally,
  and the new event is served to whoever reads from the start.
- ``empty_advance`` (cursor feed): an empty page whose ``next_cursor`` is the other token
  variant of the request cursor's position (the start's is the ``advance`` token of 0): a
  new string that resumes at the same position. Always applies.
- ``skip_advance`` (cursor feed): an empty page although events wait after the cursor, whose
  ``next_cursor`` is the token of the highest position: a new token that skips them, breaking
  the ``empty-advance`` promise (a new token on an empty page resumes where nothing was
  missed). Applies only when the page would not be empty.
- ``stuck_token`` (both feeds): an empty page although events are pending; cursor feed:
  ``next_cursor`` is the request cursor; timestamp feed: ``W`` is ``min(after, W)``, or null
  without ``after``. Applies only when the page would not be empty.
- ``big_tie`` (commits; seen on the timestamp feed): the next ``count`` committed payments
  all get the timestamp of the first of them. Until the last of them is committed (or the
  faults are cleared), ``W`` stays below that timestamp. Always applies.
- ``late_tie`` (commits; seen on the timestamp feed): the next committed payment gets the
  highest ``W`` this process has served as its timestamp: an event at an already closed
  timestamp, breaking that page's promise. Applies once a watermark has been served.
- ``conflicting_identity`` (both feeds): the page starts with an event that contradicts one
  already served. Cursor feed: at the cursor's position, the event_id, evidence and signature
  of another payment (the one just below it, else the page's first). Timestamp feed: the
  event_id and timestamp of the last event at or below ``after``, with the evidence and
  signature of another payment (the one just before it, else the page's first). Applies
  when both events exist.
- ``bad_signature`` (both feeds): the first event of the page has its signature's last bit
  flipped (still 64 lower-case hex digits). Applies when the page is not empty.
- ``page_cap`` (timestamp feed): the page is silently cut to its first ``PAGE_CAP_EVENTS``
  (2) events, below the limit asked, with ``W`` as without the fault: breaks the promise
  that a short page is the whole answer (``short-page-end``). Applies when the page would
  hold more events than that.
- ``lying_watermark`` (timestamp feed): ``W`` is ``WATERMARK_LIE`` (5) seconds more than
  the truth, and commits go on getting the clock's second, so the next ones land at or
  below the ``W`` served: breaks the ``watermark`` promise. The lie is not remembered as
  served (``late_tie`` and the floor ignore it). Applies when there is a watermark.

The cursor-feed backfill and the commit modes are the only faults that write; a payment or
synthetic event committed under one is a real row, served on both feeds from then on.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from devstack.provider.cursors import CursorCodec, CursorError, Variant
from devstack.provider.faults import FeedFault, FeedFaultMode, FeedFaultQueue, FeedFaultRequest
from devstack.provider.payments import (
    Payment,
    PaymentRequest,
    new_reference,
    paid_fingerprint,
    record_payment,
)
from devstack.provider.store import POSITION_STEP, Entry, PaymentStore, Stamp, Transaction

__all__ = [
    "BACKFILL_REACH",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "OVERLAP_EVENTS",
    "PAGE_CAP_EVENTS",
    "WATERMARK_LIE",
    "CursorEvent",
    "CursorPage",
    "FeedError",
    "Feeds",
    "TimestampEvent",
    "TimestampPage",
    "event_id",
    "parse_after",
    "parse_cursor",
    "parse_limit",
]

DEFAULT_LIMIT = 100
# A page's events are at most this many (plus a fault's extras): bounds each answer's size.
MAX_LIMIT = 500
# Already served events the overlap fault repeats.
OVERLAP_EVENTS = 3
# Seconds behind the watermark a timestamp-feed request's ``after`` may be for a backfill
# fault to apply to it.
BACKFILL_REACH = 60
# Events a page_cap page is cut to: fewer than any limit an observer asks but the smallest.
PAGE_CAP_EVENTS = 2
# Seconds a lying_watermark page's W claims beyond the truth.
WATERMARK_LIE = 5
# A token is 19 characters; a longer parameter is refused before anything decodes it.
MAX_CURSOR_LENGTH = 64

_LIMIT_DIGITS = 3
_AFTER_DIGITS = 12  # Unix seconds for the next 30 000 years, and int() stays cheap

CURSOR_FAULTS = frozenset(
    {
        FeedFaultMode.OVERLAP,
        FeedFaultMode.BACKFILL,
        FeedFaultMode.EMPTY_ADVANCE,
        FeedFaultMode.SKIP_ADVANCE,
        FeedFaultMode.STUCK_TOKEN,
        FeedFaultMode.CONFLICTING_IDENTITY,
        FeedFaultMode.BAD_SIGNATURE,
    }
)
TIMESTAMP_FAULTS = (CURSOR_FAULTS - {FeedFaultMode.EMPTY_ADVANCE, FeedFaultMode.SKIP_ADVANCE}) | {
    FeedFaultMode.PAGE_CAP,
    FeedFaultMode.LYING_WATERMARK,
}
COMMIT_FAULTS = frozenset({FeedFaultMode.BIG_TIE, FeedFaultMode.LATE_TIE})

# The payout a backfill fault commits, declined, for a fresh operation each time.
_BACKFILL_BENEFICIARY = "FEED BACKFILL"
_BACKFILL_AMOUNT = 1
_BACKFILL_CURRENCY = "EUR"


class FeedError(ValueError):
    """A feed request the simulator refuses (400)."""


class CursorEvent(msgspec.Struct, frozen=True):
    event_id: str
    position: int
    evidence: msgspec.Raw
    signature: str


class CursorPage(msgspec.Struct, frozen=True):
    events: list[CursorEvent]
    next_cursor: str


class TimestampEvent(msgspec.Struct, frozen=True):
    event_id: str
    timestamp: int
    evidence: msgspec.Raw
    signature: str


class TimestampPage(msgspec.Struct, frozen=True):
    events: list[TimestampEvent]
    finality_watermark: int | None


def event_id(reference: str) -> str:
    """The event of the payment with this reference."""
    return "evt_" + reference


def _single(values: list[str], name: str) -> str | None:
    if len(values) > 1:
        raise FeedError(f"give {name} at most once")
    return values[0] if values else None


def parse_limit(values: list[str]) -> int:
    raw = _single(values, "limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _LIMIT_DIGITS):
        raise FeedError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    limit = int(raw)
    if not 1 <= limit <= MAX_LIMIT:
        raise FeedError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return limit


def parse_cursor(values: list[str]) -> str:
    raw = _single(values, "cursor")
    if raw is None:
        return ""
    if len(raw) > MAX_CURSOR_LENGTH:
        raise FeedError("malformed cursor")
    return raw


def parse_after(values: list[str]) -> int | None:
    raw = _single(values, "after")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _AFTER_DIGITS):
        raise FeedError("after must be whole Unix seconds, 0 or more")
    return int(raw)


class Feeds:
    """The feeds' state in one process: armed faults, the timestamp floor, the served
    watermark and a tie in progress. Every method is synchronous and holds one lock (the app
    runs them in a thread); it takes the store's transaction inside that lock, never outside.
    """

    def __init__(self, secret: str, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret
        self._codec = CursorCodec(secret)
        self._clock = clock
        self._lock = threading.Lock()
        self._faults = FeedFaultQueue()
        # the least timestamp a commit may still get (read from the store when first needed)
        self._floor: int | None = None
        # the highest finality watermark served by this process
        self._served: int | None = None
        # the timestamp a big_tie in progress gives every payment it covers
        self._tie: int | None = None
        self._backfill_fingerprint = paid_fingerprint(_backfill_request("0" * 64))

    # -- the controls ----------------------------------------------------------------------

    def arm(self, request: FeedFaultRequest) -> list[FeedFault]:
        with self._lock:
            self._faults.arm(request)
            return self._faults.armed()

    def armed(self) -> list[FeedFault]:
        with self._lock:
            return self._faults.armed()

    def clear(self) -> list[FeedFault]:
        with self._lock:
            self._faults.clear()
            self._tie = None
            return self._faults.armed()

    # -- commits ---------------------------------------------------------------------------

    def commit(self, store: PaymentStore, payment: Payment) -> tuple[Payment, bool]:
        """Commit ``payment`` unless its sink key has a row, placing it in the feeds."""
        with self._lock:
            plans: list[tuple[Stamp, tuple[int, FeedFaultMode, int] | None]] = []

            def stamp(tx: Transaction) -> Stamp:
                usual = self._usual_timestamp(tx)
                fault = self._faults.first(COMMIT_FAULTS, lambda mode: self._tie_for(mode, usual))
                placed = Stamp(
                    position=tx.last_position() + POSITION_STEP,
                    timestamp=usual if fault is None else fault[2],
                )
                plans.append((placed, fault))
                return placed

            stored, created = store.commit(payment, stamp)
            if created:
                placed, fault = plans[0]
                self._raise_floor(placed.timestamp)
                if fault is not None:
                    last = self._faults.consume(fault[0])
                    if fault[1] is FeedFaultMode.BIG_TIE:
                        self._tie = None if last else placed.timestamp
        return stored, created

    def _tie_for(self, mode: FeedFaultMode, usual: int) -> int | None:
        if mode is FeedFaultMode.BIG_TIE:
            return usual if self._tie is None else self._tie
        return self._served  # late_tie: at the highest watermark served, once there is one

    def _usual_timestamp(self, tx: Transaction) -> int:
        """The timestamp a commit gets now: the clock's second, never below the floor."""
        return max(int(self._clock()), self._floor_of(tx))

    def _floor_of(self, tx: Transaction) -> int:
        if self._floor is None:
            self._floor = tx.last_timestamp()
        return self._floor

    def _raise_floor(self, timestamp: int) -> None:
        self._floor = timestamp if self._floor is None else max(self._floor, timestamp)

    # -- the cursor feed -------------------------------------------------------------------

    def cursor_page(self, store: PaymentStore, cursor: str, limit: int) -> CursorPage:
        try:
            position, variant = self._codec.decode(cursor)
        except CursorError as exc:
            raise FeedError(str(exc)) from None
        with self._lock:
            with store.transaction() as tx:
                fresh = tx.after_position(position, limit)
                fault = self._faults.first(
                    CURSOR_FAULTS,
                    lambda mode: self._cursor_fault(mode, tx, cursor, position, variant, fresh),
                )
            if fault is None:
                return self._cursor_page(cursor, fresh)
            self._faults.consume(fault[0])
            return fault[2]

    def _cursor_page(
        self, cursor: str, fresh: list[Entry], before: list[CursorEvent] | None = None
    ) -> CursorPage:
        events = [_cursor_event(entry) for entry in fresh]
        next_cursor = self._codec.encode(fresh[-1].position) if fresh else cursor
        return CursorPage(events=(before or []) + events, next_cursor=next_cursor)

    def _cursor_fault(
        self,
        mode: FeedFaultMode,
        tx: Transaction,
        cursor: str,
        position: int,
        variant: Variant,
        fresh: list[Entry],
    ) -> CursorPage | None:
        """The page ``mode`` makes of this request, or None when it does not apply."""
        match mode:
            case FeedFaultMode.OVERLAP:
                served = tx.up_to_position(position, OVERLAP_EVENTS) if position else []
                if not served:
                    return None
                return self._cursor_page(cursor, fresh, [_cursor_event(e) for e in served])
            case FeedFaultMode.BACKFILL:
                free = tx.free_position_below(position) if position else None
                if free is None:
                    return None
                # a commit now would get the tie's timestamp while one is in progress
                timestamp = self._tie if self._tie is not None else self._usual_timestamp(tx)
                tx.insert(self._backfill_payment(), Stamp(position=free, timestamp=timestamp))
                self._raise_floor(timestamp)
                return self._cursor_page(cursor, fresh)
            case FeedFaultMode.EMPTY_ADVANCE:
                renamed = self._codec.encode(position, variant.other)
                return CursorPage(events=[], next_cursor=renamed)
            case FeedFaultMode.STUCK_TOKEN:
                return CursorPage(events=[], next_cursor=cursor) if fresh else None
            case FeedFaultMode.SKIP_ADVANCE:
                if not fresh:
                    return None
                return CursorPage(events=[], next_cursor=self._codec.encode(tx.last_position()))
            case FeedFaultMode.CONFLICTING_IDENTITY:
                if not position or tx.at_position(position) is None:
                    return None
                below = tx.up_to_position(position - 1, 1)
                other = below[-1] if below else (fresh[0] if fresh else None)
                if other is None:
                    return None
                clash = CursorEvent(
                    event_id=event_id(other.reference),
                    position=position,
                    evidence=msgspec.Raw(other.evidence),
                    signature=other.signature,
                )
                return self._cursor_page(cursor, fresh, [clash])
            case FeedFaultMode.BAD_SIGNATURE:
                if not fresh:
                    return None
                return self._cursor_page(cursor, [_corrupted(fresh[0]), *fresh[1:]])
        return None

    # -- the timestamp feed ----------------------------------------------------------------

    def timestamp_page(self, store: PaymentStore, after: int | None, limit: int) -> TimestampPage:
        with self._lock:
            with store.transaction() as tx:
                mark = self._watermark(tx)
                fresh = tx.after_timestamp(after, limit)
                fault = self._faults.first(
                    TIMESTAMP_FAULTS,
                    lambda mode: self._timestamp_fault(mode, tx, after, mark, fresh),
                )
            page = TimestampPage([_timestamp_event(e) for e in fresh], mark)
            lied = False
            if fault is not None:
                self._faults.consume(fault[0])
                page = fault[2]
                lied = fault[1] is FeedFaultMode.LYING_WATERMARK
            if page.finality_watermark is not None and not lied:
                served = page.finality_watermark
                self._served = served if self._served is None else max(self._served, served)
                self._raise_floor(served + 1)
            return page

    def _watermark(self, tx: Transaction) -> int | None:
        """No event committed from now on gets a timestamp at or below this (bar faults)."""
        mark = self._usual_timestamp(tx) - 1
        if self._tie is not None:
            mark = min(mark, self._tie - 1)
        return mark if mark >= 0 else None

    def _timestamp_fault(
        self,
        mode: FeedFaultMode,
        tx: Transaction,
        after: int | None,
        mark: int | None,
        fresh: list[Entry],
    ) -> TimestampPage | None:
        """The page ``mode`` makes of this request, or None when it does not apply."""
        events = [_timestamp_event(entry) for entry in fresh]
        match mode:
            case FeedFaultMode.OVERLAP:
                served = tx.up_to_timestamp(after, OVERLAP_EVENTS) if after is not None else []
                if not served:
                    return None
                return TimestampPage([_timestamp_event(e) for e in served] + events, mark)
            case FeedFaultMode.BACKFILL:
                if after is None or (mark is not None and after < mark - BACKFILL_REACH):
                    return None
                timestamp = after if mark is None else min(after, mark)
                stamp = Stamp(position=tx.last_position() + POSITION_STEP, timestamp=timestamp)
                tx.insert(self._backfill_payment(), stamp)
                return TimestampPage(events, mark)
            case FeedFaultMode.STUCK_TOKEN:
                if not fresh:
                    return None
                held = None if after is None or mark is None else min(after, mark)
                return TimestampPage([], held)
            case FeedFaultMode.CONFLICTING_IDENTITY:
                served = tx.up_to_timestamp(after, 2) if after is not None else []
                if not served:
                    return None
                other = served[0] if len(served) == 2 else (fresh[0] if fresh else None)
                if other is None:
                    return None
                clash = TimestampEvent(
                    event_id=event_id(served[-1].reference),
                    timestamp=served[-1].timestamp,
                    evidence=msgspec.Raw(other.evidence),
                    signature=other.signature,
                )
                return TimestampPage([clash, *events], mark)
            case FeedFaultMode.BAD_SIGNATURE:
                if not fresh:
                    return None
                return TimestampPage([_timestamp_event(_corrupted(fresh[0])), *events[1:]], mark)
            case FeedFaultMode.PAGE_CAP:
                if len(events) <= PAGE_CAP_EVENTS:
                    return None
                return TimestampPage(events[:PAGE_CAP_EVENTS], mark)
            case FeedFaultMode.LYING_WATERMARK:
                if mark is None:
                    return None
                return TimestampPage(events, mark + WATERMARK_LIE)
        return None

    # -- helpers ---------------------------------------------------------------------------

    def _backfill_payment(self) -> Payment:
        request = _backfill_request(self._backfill_fingerprint)
        return record_payment(
            f"{request.operation_id}:{request.binding_generation}",
            request,
            outcome="declined",
            reference=new_reference(),
            now=datetime.fromtimestamp(self._clock(), UTC),
            secret=self._secret,
        )


def _backfill_request(fingerprint: str) -> PaymentRequest:
    return PaymentRequest(
        operation_id=uuid.uuid4(),
        binding_generation=1,
        request_fingerprint=fingerprint,
        beneficiary=_BACKFILL_BENEFICIARY,
        amount=_BACKFILL_AMOUNT,
        currency=_BACKFILL_CURRENCY,
    )


def _cursor_event(entry: Entry) -> CursorEvent:
    return CursorEvent(
        event_id=event_id(entry.reference),
        position=entry.position,
        evidence=msgspec.Raw(entry.evidence),
        signature=entry.signature,
    )


def _timestamp_event(entry: Entry) -> TimestampEvent:
    return TimestampEvent(
        event_id=event_id(entry.reference),
        timestamp=entry.timestamp,
        evidence=msgspec.Raw(entry.evidence),
        signature=entry.signature,
    )


def _corrupted(entry: Entry) -> Entry:
    """The entry with the last bit of its signature flipped: 64 hex digits that do not verify."""
    flipped = format(int(entry.signature, 16) ^ 1, "064x")
    return msgspec.structs.replace(entry, signature=flipped)
