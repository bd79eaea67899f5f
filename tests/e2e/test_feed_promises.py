"""Each promise a feed's source may break, end to end: the simulator breaks it (a silent
page cap breaks ``short-page-end``, a lying watermark breaks ``watermark``, an empty page
whose new token skips waiting events breaks ``empty-advance``) under a real observer
process configured both ways. Declared honestly, the observer skips nothing and raises no
alarm; declared to trust the broken promise, its checkpoint runs ahead of the events, and
the late-event audit (timestamp feeds) or the reconciliation pass (cursor feeds that may
backfill), which trust no such promise, find every one of them: an alarm and one final
receipt each, never a silent skip.

A provider of its own per test, so the feed holds only the test's events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Services
from tests.e2e.client import scalar, until
from tests.e2e.observer import Observer
from tests.e2e.provider import ProviderProcess

pytestmark = pytest.mark.e2e

# Far past any event's timestamp: a page after it holds only the watermark.
FAR_FUTURE = 10**11


@pytest.fixture
def provider() -> Iterator[ProviderProcess]:
    with ProviderProcess() as proc:
        yield proc


def paid(provider: ProviderProcess, count: int) -> list[str]:
    """``count`` new payments; their event ids. Their operations are not the server's: the
    observer (grace 0) quarantines each, a final receipt."""
    events = []
    for _ in range(count):
        answer = provider.pay_new()
        assert answer.status_code == 201, answer.text
        events.append("evt_" + answer.json()["reference"])
    return events


def watermark(provider: ProviderProcess) -> int:
    page = provider.timestamp_feed(FAR_FUTURE, 1).json()
    mark: int = page["finality_watermark"]
    return mark


def timestamps(provider: ProviderProcess) -> dict[str, int]:
    page: dict[str, Any] = provider.timestamp_feed(None, 500).json()
    return {event["event_id"]: event["timestamp"] for event in page["events"]}


def receipts(database_url: str, feed: str, events: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for event in events:
        state = scalar(
            database_url,
            "SELECT (SELECT state FROM feed_receipts WHERE feed = :n AND event_id = :e)",
            n=feed,
            e=event,
        )
        if state is not None:
            found[event] = str(state)
    return found


def late_alarms(database_url: str, feed: str, kind: str = "late-event") -> int:
    return int(
        scalar(
            database_url,
            "SELECT count(*) FROM feed_alarms WHERE feed = :n AND kind = :k",
            n=feed,
            k=kind,
        )
    )


def settled(database_url: str, feed: str, events: list[str]) -> dict[str, str] | None:
    got = receipts(database_url, feed, events)
    return got if len(got) == len(events) and "held" not in got.values() else None


@pytest.mark.parametrize("trusted", [False, True], ids=["honest", "trusting"])
def test_a_silent_page_cap(
    services: Services, app_database: str, provider: ProviderProcess, trusted: bool
) -> None:
    """Five events already behind the watermark; the first page that would hold them is
    cut to two, the watermark as if it were whole."""
    events = paid(provider, 5)
    newest = max(timestamps(provider)[e] for e in events)
    until(lambda: watermark(provider) >= newest, "the watermark passes the events")
    provider.arm_feed("page_cap")
    promises = "later-timestamp+watermark" + ("+short-page-end" if trusted else "")
    observer = Observer(
        services.redis_url, app_database, provider, "timestamp", page_size=50, promises=promises
    )
    try:
        until(lambda: not provider.feed_faults(), "the capped page is served")
        states = until(lambda: settled(app_database, observer.name, events), "every receipt")
        alarms = late_alarms(app_database, observer.name)
    finally:
        observer.stop()
    assert set(states.values()) == {"quarantined"}
    # trusting the broken promise closed over three events; the audit found each of them
    assert alarms == (3 if trusted else 0)


@pytest.mark.parametrize("trusted", [False, True], ids=["honest", "trusting"])
def test_a_lying_watermark(
    services: Services, app_database: str, provider: ProviderProcess, trusted: bool
) -> None:
    """Every page's watermark is 5 s ahead of the truth while a payment is made: the
    payment lands at or below a watermark already served."""
    first = paid(provider, 1)
    promises = "later-timestamp+short-page-end" + ("+watermark" if trusted else "")
    observer = Observer(
        services.redis_url, app_database, provider, "timestamp", page_size=50, promises=promises
    )
    try:
        until(lambda: settled(app_database, observer.name, first), "the first receipt")
        provider.arm_feed("lying_watermark", 1000)
        until(lambda: len(provider.feed_faults()) == 1 and _used(provider), "a lie is served")
        late = paid(provider, 1)
        states = until(lambda: settled(app_database, observer.name, late), "the late receipt")
        provider.clear_feed_faults()
        alarms = late_alarms(app_database, observer.name)
    finally:
        observer.stop()
    assert set(states.values()) == {"quarantined"}
    assert alarms == (1 if trusted else 0)


def _used(provider: ProviderProcess) -> bool:
    armed = provider.feed_faults()
    return bool(armed) and armed[0]["count"] < 1000


@pytest.mark.parametrize("trusted", [False, True], ids=["honest", "trusting"])
def test_an_empty_page_whose_new_token_skips_waiting_events(
    services: Services, app_database: str, provider: ProviderProcess, trusted: bool
) -> None:
    """Three events wait; the first page is empty with a token past them. Trusted, the
    token is adopted and the main pages never serve them; the reconciliation pass (this
    feed does not promise no-backfill) finds them once a later event moves the applied
    position past them."""
    skipped = paid(provider, 3)
    provider.arm_feed("skip_advance")
    observer = Observer(
        services.redis_url,
        app_database,
        provider,
        "cursor",
        page_size=50,
        promises="empty-advance" if trusted else None,
    )
    try:
        until(lambda: not provider.feed_faults(), "the skipping page is served")
        later = paid(provider, 1)
        states = until(
            lambda: settled(app_database, observer.name, skipped + later), "every receipt"
        )
        alarms = late_alarms(app_database, observer.name, "backfill")
    finally:
        observer.stop()
    assert set(states.values()) == {"quarantined"}
    assert alarms == (3 if trusted else 0)
