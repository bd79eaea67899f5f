"""What each timestamp feed's source promises (SETTLEMENT_FEED_PROMISES): declared, checked
at start, and nothing else relied on."""

from __future__ import annotations

import pytest

from service.config import (
    DEFAULT_TIMESTAMP_PROMISES,
    TIMESTAMP_PROMISES,
    ConfigError,
    Settings,
)

FEEDS = "pay=cursor:http://p/feeds/cursor,ts=timestamp:http://p/feeds/timestamp"


def specs(promises: str) -> dict[str, frozenset[str]]:
    settings = Settings.from_env({"SETTLEMENT_FEEDS": FEEDS, "SETTLEMENT_FEED_PROMISES": promises})
    return {spec.name: spec.promises for spec in settings.feed_specs()}


def test_a_timestamp_feed_no_promise_names_is_taken_to_promise_its_order_only() -> None:
    assert specs("") == {"pay": frozenset(), "ts": DEFAULT_TIMESTAMP_PROMISES}
    assert {"later-timestamp"} == DEFAULT_TIMESTAMP_PROMISES


def test_declared_promises_are_the_ones_relied_on() -> None:
    assert specs("ts=watermark+short-page-end")["ts"] == {"watermark", "short-page-end"}
    assert specs("pay=no-backfill")["pay"] == {"no-backfill"}
    assert specs("pay=empty-advance+no-backfill")["pay"] == {"no-backfill", "empty-advance"}
    assert specs(" ts=later-timestamp+watermark+short-page-end ")["ts"] == TIMESTAMP_PROMISES


@pytest.mark.parametrize(
    ("promises", "says"),
    [
        ("ts=watermark+honest", "unknown promise 'honest'"),
        ("ts=short-page-end", "needs a finality proof"),
        ("pay=watermark", "unknown promise 'watermark' of a cursor feed"),
        ("ts=no-backfill+watermark", "unknown promise 'no-backfill' of a timestamp feed"),
        ("ts=empty-advance+watermark", "unknown promise 'empty-advance' of a timestamp feed"),
        ("nope=watermark", "nope is not a feed"),
        ("ts", "is not name=promise"),
        ("ts=", "is not name=promise"),
        ("ts=watermark,ts=later-timestamp", "named twice"),
    ],
)
def test_a_promise_that_cannot_be_relied_on_stops_the_start(promises: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"SETTLEMENT_FEED_PROMISES: .*{says}"):
        Settings.from_env({"SETTLEMENT_FEEDS": FEEDS, "SETTLEMENT_FEED_PROMISES": promises})
