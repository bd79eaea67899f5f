"""The feeds' figures of /metrics: one writer per metrics directory, every worker a reader,
and a scrape that renders whatever was kept last (nothing yet: age +Inf)."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec

from service.app.feed_figures import FeedFigureKeeper, FeedFigures
from service.telemetry.feed_figures import FIGURES_FILE, FigureShelf


def age_of(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("settlement_feed_figures_age_seconds "):
            return float(line.split()[1])
    raise AssertionError(text)


def test_one_shelf_of_a_directory_writes_at_a_time_the_next_takes_over(tmp_path: Path) -> None:
    first, second = FigureShelf(str(tmp_path)), FigureShelf(str(tmp_path))
    assert first.lead()
    assert first.lead()  # held, still
    assert not second.lead()
    first.put(b"one")
    assert second.get() == b"one"  # every worker reads what the writer kept
    first.close()  # a worker gone: the lock goes with it
    assert second.lead()
    assert not first.lead()
    second.close()


def test_without_a_directory_the_process_keeps_its_own() -> None:
    shelf = FigureShelf(None)
    assert shelf.lead()
    assert shelf.get() is None
    shelf.put(b"kept")
    assert shelf.get() == b"kept"


def keeper(shelf: FigureShelf, now: float) -> FeedFigureKeeper:
    return FeedFigureKeeper(shelf, external_routes=(), interval=15.0, clock=lambda: now)


def test_a_scrape_before_any_read_shows_no_figures_and_an_infinite_age(tmp_path: Path) -> None:
    text = keeper(FigureShelf(str(tmp_path)), 100.0).exposition()
    assert math.isinf(age_of(text))
    assert "settlement_feed_events{" not in text


def test_a_scrape_shows_the_figures_kept_with_their_age(tmp_path: Path) -> None:
    shelf = FigureShelf(str(tmp_path))
    figures = FeedFigures(
        events=[("payments", "held", 3)],
        alarms=[("payments", "late-event", 1)],
        lags=[("payments", 2.5)],
        oldest_unknown=7.0,
        read_at=100.0,
    )
    shelf.put(msgspec.json.encode(figures))
    text = keeper(FigureShelf(str(tmp_path)), 112.0).exposition()
    assert 'settlement_feed_events{feed="payments",state="held"} 3.0' in text
    assert 'settlement_feed_alarms_total{feed="payments",kind="late-event"} 1.0' in text
    assert 'settlement_feed_lag_seconds{feed="payments"} 2.5' in text
    assert "settlement_feed_oldest_unknown_seconds 7.0" in text
    assert age_of(text) == 12.0


def test_a_figures_file_of_another_shape_is_as_none(tmp_path: Path) -> None:
    (tmp_path / FIGURES_FILE).write_bytes(b'{"not": "figures"}')
    assert math.isinf(age_of(keeper(FigureShelf(str(tmp_path)), 1.0).exposition()))
