"""The feeds' figures of ``/metrics``, and the operations' read with them: kept where every
worker of a server reads them, and rendered as Prometheus text.

A scrape never asks the database: one worker at a time reads the figures on its own
connection every ``SETTLEMENT_FEED_FIGURES_INTERVAL`` (:class:`service.app.feed_figures.
FeedFigureKeeper`) and puts them on a :class:`FigureShelf`; every scrape renders the last
ones put there, with their age.

**One reader per server.** With a metrics directory (``settlement serve``'s workers), the
shelf is a file there, and only the worker holding the directory's lock file
(``flock``, not blocking) reads the database and writes the file, replaced whole so no
scrape reads half of it. The kernel drops a dead worker's lock, so another worker takes over
at its next turn. Without a directory the shelf is this process's memory, and the process
its only reader.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["FIGURES_FILE", "FigureShelf", "feed_exposition", "work_exposition"]

# The shelf's file in a metrics directory, and the lock file whose holder writes it.
FIGURES_FILE = "feed-figures.json"
_LOCK_FILE = "feed-figures.lock"


class FigureShelf:
    """Where the last figures are kept: a file of the metrics directory ``shared_dir`` (every
    worker reads it; the holder of the directory's lock writes it), or without one, this
    process's memory."""

    def __init__(self, shared_dir: str | None) -> None:
        self._dir = None if shared_dir is None else Path(shared_dir)
        self._kept: bytes | None = None
        self._lock: IO[bytes] | None = None

    def lead(self) -> bool:
        """Whether this process writes the figures: it holds the directory's lock (taken
        now if free; never waits), or there is no directory."""
        if self._dir is None or self._lock is not None:
            return True
        lock = (self._dir / _LOCK_FILE).open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another worker holds it
            lock.close()
            return False
        self._lock = lock
        return True

    def put(self, data: bytes) -> None:
        """Keep ``data`` as the last figures (the file replaced whole)."""
        if self._dir is None:
            self._kept = data
            return
        part = self._dir / f".{FIGURES_FILE}.{os.getpid()}"
        part.write_bytes(data)
        part.replace(self._dir / FIGURES_FILE)

    def get(self) -> bytes | None:
        """The last figures kept (None: none yet)."""
        if self._dir is None:
            return self._kept
        try:
            return (self._dir / FIGURES_FILE).read_bytes()
        except OSError:  # none yet (or unreadable): a scrape still answers, the age +Inf
            return None

    def close(self) -> None:
        """Let another worker write the figures."""
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()
            self._lock = None


def feed_exposition(
    events: Sequence[tuple[str, str, int]],
    alarms: Sequence[tuple[str, str, int]],
    lags: Sequence[tuple[str, float]],
    oldest_unknown: float | None,
    age: float,
    stalls: Sequence[tuple[str, float]] = (),
) -> str:
    """The feeds' figures in the Prometheus text format, by prometheus_client's metric
    families: receipts by (feed, state), alarms by (feed, kind), each feed's lag, the oldest
    unknown external operation's age (None: not read yet), ``age``, how old they are
    (``+Inf``: never read), and each feed's stall (0: not stalled)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    by_state = GaugeMetricFamily(
        "settlement_feed_events",
        "Feed events by receipt state (ignored: a replay).",
        labels=["feed", "state"],
    )
    for feed, state, n in events:
        by_state.add_metric([feed, state], n)
    by_kind = CounterMetricFamily(
        "settlement_feed_alarms", "Feed alarms raised, by kind.", labels=["feed", "kind"]
    )
    for feed, kind, n in alarms:
        by_kind.add_metric([feed, kind], n)
    lag = GaugeMetricFamily(
        "settlement_feed_lag_seconds",
        "Seconds since the feed's observer last found nothing new.",
        labels=["feed"],
    )
    for feed, seconds in lags:
        lag.add_metric([feed], seconds)
    stalled = GaugeMetricFamily(
        "settlement_feed_stalled_seconds",
        "Seconds the feed has made no progress past a hold or an unknown external operation, "
        "once longer than SETTLEMENT_FEED_STALL_AFTER (0: not stalled).",
        labels=["feed"],
    )
    for feed, seconds in stalls:
        stalled.add_metric([feed], seconds)
    oldest = GaugeMetricFamily(
        "settlement_feed_oldest_unknown_seconds",
        "Seconds since the longest-unknown external operation became unknown (what the feeds "
        "should settle; 0: none).",
        value=oldest_unknown,
    )
    fresh = GaugeMetricFamily(
        "settlement_feed_figures_age_seconds",
        "Seconds since the settlement_feed_* figures were read from the database (every "
        "SETTLEMENT_FEED_FIGURES_INTERVAL by one worker; +Inf: not read yet).",
        value=age if math.isfinite(age) else math.inf,
    )

    class Feeds(Collector):
        def collect(self) -> Iterable[Any]:
            return [by_state, by_kind, lag, stalled, oldest, fresh]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Feeds())
    return generate_latest(registry).decode()


def work_exposition(
    open_operations: Sequence[tuple[str, int]], purge_backlog: float | None, cap: int
) -> str:
    """The operations' figures read with the feeds' (same age): open operations by state,
    each counted up to ``cap``, and the purge's backlog in seconds (None: not read yet)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    by_state = GaugeMetricFamily(
        "settlement_operations_open",
        f"Operations not settled for good, by state (in_progress, unknown, conflict), each "
        f"counted up to {cap}: {cap} means at least that many.",
        labels=["state"],
    )
    for state, n in open_operations:
        by_state.add_metric([state], n)
    backlog = GaugeMetricFamily(
        "settlement_purge_backlog_seconds",
        "Seconds since the oldest terminal operation still stored expired: how far the "
        "retention purge is behind (0: nothing expired is left).",
        value=purge_backlog,
    )

    class Work(Collector):
        def collect(self) -> Iterable[Any]:
            return [by_state, backlog]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Work())
    return generate_latest(registry).decode()
