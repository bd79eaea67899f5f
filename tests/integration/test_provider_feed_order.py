"""Where the provider simulator puts each payment in its feeds, on its real SQLite store with a
controlled clock: positions and timestamps never go back, a finality watermark is never
broken by a commit that was in progress or by a clock stepping back, a big tie holds the
watermark below it, a file made before the feeds is migrated in place, and backfills only
ever take free positions."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from devstack.provider.faults import FeedFaultMode, FeedFaultRequest
from devstack.provider.feeds import CursorEvent, Feeds, TimestampPage
from devstack.provider.payments import Payment, PaymentRequest, new_reference, record_payment
from devstack.provider.store import POSITION_STEP, Counts, PaymentStore
from service.evidence import SignedEvidence, verify
from tests.e2e.provider import make_payment
from tests.integration.factories import Clock

SECRET = "feed-order-secret"
START = 1_800_000_000.25
# How long the committing thread's clock read stalls: the page request starts meanwhile.
STALL = 0.3
EVERYTHING = 500

# The table as it was before the feeds: no position, no timestamp.
_OLD_SCHEMA = """
CREATE TABLE payments (
    sink_key   TEXT PRIMARY KEY,
    reference  TEXT NOT NULL UNIQUE,
    request    BLOB NOT NULL,
    outcome    TEXT NOT NULL CHECK (outcome IN ('completed', 'declined')),
    status     INTEGER NOT NULL,
    evidence   BLOB NOT NULL,
    signature  TEXT NOT NULL,
    created_at TEXT NOT NULL
)
"""


class StallingClock(Clock):
    """Reads from the thread named ``stalled`` take the time, signal, then wait ``STALL``."""

    def __init__(self, now: float = START) -> None:
        super().__init__(now)
        self.read = threading.Event()

    def __call__(self) -> float:
        now = self.now
        if threading.current_thread().name == "stalled":
            self.read.set()
            time.sleep(STALL)
        return now


def new_payment(at: float = START) -> Payment:
    body, key = make_payment()
    return record_payment(
        key,
        msgspec.convert(body, type=PaymentRequest),
        outcome="completed",
        reference=new_reference(),
        now=datetime.fromtimestamp(at, UTC),
        secret=SECRET,
    )


def everything(feeds: Feeds, store: PaymentStore) -> TimestampPage:
    return feeds.timestamp_page(store, None, EVERYTHING)


def timestamps(page: TimestampPage) -> dict[str, int]:
    return {event.event_id: event.timestamp for event in page.events}


def signed_of(event: CursorEvent) -> SignedEvidence:
    picked = {"evidence": event.evidence, "signature": event.signature}
    return msgspec.json.decode(msgspec.json.encode(picked), type=SignedEvidence)


def arm(feeds: Feeds, mode: FeedFaultMode, count: int = 1) -> None:
    feeds.arm(FeedFaultRequest(mode=mode, count=count))


@pytest.fixture
def store(tmp_path: Path) -> PaymentStore:
    return PaymentStore.open(tmp_path / "provider.sqlite3")


def test_commits_get_growing_positions_and_their_second_as_timestamp(store: PaymentStore) -> None:
    clock = Clock(START)
    feeds = Feeds(SECRET, clock=clock)
    for _ in range(3):
        feeds.commit(store, new_payment())
        clock.advance(0.4)

    page = feeds.cursor_page(store, "", EVERYTHING)

    assert [e.position for e in page.events] == [10, 20, 30]
    assert list(timestamps(everything(feeds, store)).values()) == [
        int(START),
        int(START + 0.4),
        int(START + 0.8),
    ]


def test_a_commit_in_progress_is_in_the_page_or_above_its_watermark(store: PaymentStore) -> None:
    """The commit reads the clock (second S), then stalls; the clock moves to S + 1 and a
    page is asked for, whose watermark is S. The page must wait for the commit and show it:
    answered without it, the event would appear later at a timestamp the page closed."""
    clock = StallingClock(START)
    feeds = Feeds(SECRET, clock=clock)
    committer = threading.Thread(
        target=feeds.commit, args=(store, new_payment()), name="stalled", daemon=True
    )
    committer.start()
    assert clock.read.wait(5)
    clock.advance(1)

    page = everything(feeds, store)
    committer.join(5)
    after = everything(feeds, store)

    assert page.finality_watermark == int(START)
    closed = {e for e, ts in timestamps(after).items() if ts <= page.finality_watermark}
    assert closed <= set(timestamps(page)), "an event appeared at a timestamp already closed"
    assert len(page.events) == 1


def test_the_clock_stepping_back_moves_no_timestamp_or_watermark_back(
    store: PaymentStore,
) -> None:
    clock = Clock(START)
    feeds = Feeds(SECRET, clock=clock)
    feeds.commit(store, new_payment())
    clock.advance(5)
    served = everything(feeds, store).finality_watermark
    assert served == int(START) + 4

    clock.advance(-60)
    feeds.commit(store, new_payment())
    page = everything(feeds, store)

    assert page.finality_watermark is not None and page.finality_watermark >= served
    assert list(timestamps(page).values()) == [int(START), int(START) + 5]


def test_a_reopened_store_gives_no_timestamp_below_the_last_one(tmp_path: Path) -> None:
    path = tmp_path / "provider.sqlite3"
    with PaymentStore.open(path) as first:
        Feeds(SECRET, clock=Clock(START)).commit(first, new_payment())

    with PaymentStore.open(path) as second:
        feeds = Feeds(SECRET, clock=Clock(START - 3600))  # the clock is now an hour behind
        feeds.commit(second, new_payment())
        page = everything(feeds, second)

    assert list(timestamps(page).values()) == [int(START), int(START)]
    assert page.finality_watermark == int(START) - 1


def test_a_big_tie_holds_the_watermark_below_it_until_its_last_payment(
    store: PaymentStore,
) -> None:
    clock = Clock(START)
    feeds = Feeds(SECRET, clock=clock)
    arm(feeds, FeedFaultMode.BIG_TIE, 3)

    feeds.commit(store, new_payment())
    clock.advance(10)
    feeds.commit(store, new_payment())
    held = everything(feeds, store)
    clock.advance(10)
    feeds.commit(store, new_payment())
    released = everything(feeds, store)
    feeds.commit(store, new_payment())

    tie = int(START)
    assert held.finality_watermark == tie - 1
    assert released.finality_watermark == int(START) + 19
    assert list(timestamps(everything(feeds, store)).values()) == [tie, tie, tie, int(START) + 20]
    assert feeds.armed() == []


def test_clearing_the_faults_ends_a_big_tie(store: PaymentStore) -> None:
    clock = Clock(START)
    feeds = Feeds(SECRET, clock=clock)
    arm(feeds, FeedFaultMode.BIG_TIE, 5)
    feeds.commit(store, new_payment())
    clock.advance(3)
    assert everything(feeds, store).finality_watermark == int(START) - 1

    feeds.clear()
    feeds.commit(store, new_payment())

    assert everything(feeds, store).finality_watermark == int(START) + 2
    assert list(timestamps(everything(feeds, store)).values()) == [int(START), int(START) + 3]


def test_late_tie_waits_for_a_served_watermark_then_lands_on_it(store: PaymentStore) -> None:
    clock = Clock(START)
    feeds = Feeds(SECRET, clock=clock)
    arm(feeds, FeedFaultMode.LATE_TIE)
    feeds.commit(store, new_payment())  # no watermark served yet: a usual commit
    assert [f.count for f in feeds.armed()] == [1]

    clock.advance(5)
    served = everything(feeds, store).finality_watermark
    clock.advance(5)
    feeds.commit(store, new_payment())

    assert served == int(START) + 4
    assert list(timestamps(everything(feeds, store)).values()) == [int(START), served]
    assert feeds.armed() == []


def test_backfills_take_only_free_positions_below_the_cursor(store: PaymentStore) -> None:
    feeds = Feeds(SECRET, clock=Clock(START))
    feeds.commit(store, new_payment())
    feeds.commit(store, new_payment())
    cursor = feeds.cursor_page(store, "", EVERYTHING).next_cursor
    free = 2 * POSITION_STEP - 2  # the integers strictly between 0, 10 and 20
    arm(feeds, FeedFaultMode.BACKFILL, free + 5)

    for _ in range(free + 5):
        assert feeds.cursor_page(store, cursor, EVERYTHING).events == []

    positions = [e.position for e in feeds.cursor_page(store, "", EVERYTHING).events]
    assert positions == list(range(1, 2 * POSITION_STEP + 1))
    assert [f.count for f in feeds.armed()] == [5]  # no room left: the rest stays armed
    assert store.counts() == Counts(count=2, declines=free)


def test_a_file_made_before_the_feeds_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "provider.sqlite3"
    old = [new_payment(at=START + 7.9), new_payment(at=START), new_payment(at=START + 3.5)]
    conn = sqlite3.connect(path)
    conn.execute(_OLD_SCHEMA)
    for p in old:
        conn.execute(
            "INSERT INTO payments VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                p.sink_key,
                p.reference,
                p.request,
                p.outcome,
                p.status,
                p.evidence,
                p.signature,
                p.created_at,
            ),
        )
    conn.commit()
    conn.close()

    with PaymentStore.open(path) as store:
        feeds = Feeds(SECRET, clock=Clock(START + 20))
        feeds.commit(store, new_payment(at=START + 20))
        cursor = feeds.cursor_page(store, "", EVERYTHING)
        by_time = everything(feeds, store)
        replayed = store.find(old[0].sink_key)

    ids = [f"evt_{p.reference}" for p in old]
    assert [e.event_id for e in cursor.events][:3] == ids  # insertion order
    assert [e.position for e in cursor.events] == [10, 20, 30, 40]
    assert timestamps(by_time) == {
        ids[0]: int(START + 7.9),
        ids[1]: int(START),
        ids[2]: int(START + 3.5),
        cursor.events[3].event_id: int(START) + 20,
    }
    assert [e.event_id for e in by_time.events][:3] == [ids[1], ids[2], ids[0]]
    assert replayed == old[0]
    for event in cursor.events:
        assert verify(signed_of(event), SECRET)

    with PaymentStore.open(path) as again:  # opening a migrated file changes nothing
        assert Feeds(SECRET).cursor_page(again, "", EVERYTHING) == cursor
