"""A stalled feed: one that has made no progress past a hold, or past an ``unknown``
external operation, for longer than ``SETTLEMENT_FEED_STALL_AFTER``. The feeds page flags it
and ``/metrics`` has a gauge per feed (``settlement_feed_stalled_seconds``), both from
:func:`read_stalls`, so one rule decides both.

* **Behind a hold**: a held event blocks its page's barrier, so the feed cannot pass it
  until it is decided. It has been stalled as long as its oldest open hold is old.
* **Behind an unknown**: the external operation unknown the longest is what the feeds
  exist to settle. A feed that has made no progress (its checkpoint has not moved, nor has
  it read its source to the end) while that operation stayed unknown has been stalled for
  the shorter of the two times (a feed still moving, or caught up, is not stalled: its
  source has simply not told of that operation yet).

The longer of the two is the feed's stall; past the setting it is flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

import msgspec

from service.store.feed_checkpoints import Checkpoint
from service.store.feeds import FeedStore

__all__ = ["Stall", "read_stalls", "since_progress", "stall_of"]

_UNKNOWN = "the external operation unknown the longest"


class Stall(msgspec.Struct, frozen=True):
    """How long a feed has made no progress past what blocks it, and what that is."""

    feed: str
    seconds: float
    behind: str
    """what blocks it, for a person: ``hold e-7 (bad-signature)`` or ``the external
    operation unknown the longest``"""
    flagged: bool
    """stalled for longer than the setting"""
    unknown_for: float | None = None
    """behind an unknown operation: how long it has been unknown (seconds)"""


def stall_of(
    feed: str,
    *,
    oldest_hold: tuple[str, str, float] | None,
    oldest_unknown: float | None,
    since_progress: float | None,
    after: float | None,
) -> Stall:
    """The rule: ``oldest_hold`` (event id, reason, age in seconds) of the feed's open
    holds; ``oldest_unknown``, the age of the longest-unknown external operation;
    ``since_progress``, seconds since the feed's checkpoint last moved (None: not known);
    ``after``: the setting (None: nothing is flagged)."""
    candidates: list[tuple[float, str]] = []
    if oldest_hold is not None:
        event_id, reason, age = oldest_hold
        candidates.append((age, f"hold {event_id} ({reason})"))
    if oldest_unknown is not None:
        blocked = oldest_unknown if since_progress is None else min(oldest_unknown, since_progress)
        candidates.append((blocked, _UNKNOWN))
    seconds, behind = max(candidates, default=(0.0, ""))
    seconds = max(0.0, seconds)
    unknown_for = oldest_unknown if behind == _UNKNOWN else None
    return Stall(feed, seconds, behind, after is not None and seconds > after, unknown_for)


def since_progress(updated_at: datetime, caught_up_at: datetime | None, now: float) -> float:
    """Seconds since the feed last made progress: its checkpoint moved (or was created), or
    it read its source to the end. A feed caught up a moment ago is not stalled behind an
    unknown operation: its source has not told of that operation yet."""
    last = updated_at if caught_up_at is None else max(updated_at, caught_up_at)
    return max(0.0, now - last.timestamp())


async def read_stalls(
    store: FeedStore,
    external_routes: Sequence[str],
    clock: Callable[[], float],
    after: float | None,
    *,
    checkpoints: Sequence[Checkpoint] | None = None,
    oldest_unknown: float | None = None,
) -> list[Stall]:
    """Every feed with a checkpoint, by name, with its stall (flagged or not). The caller's
    ``checkpoints`` and ``oldest_unknown`` are used when it has read them already."""
    if checkpoints is None:
        checkpoints = await store.checkpoints.all()
        oldest_unknown = await store.checkpoints.oldest_unknown(external_routes)
    now = clock()
    stalls = []
    for checkpoint in sorted(checkpoints, key=lambda c: c.name):
        held, _, _ = await store.receipts.holds(checkpoint.name, 1)
        oldest_hold = None if not held else (held[0].event_id, held[0].reason, held[0].age)
        since = since_progress(checkpoint.updated_at, checkpoint.caught_up_at, now)
        stalls.append(
            stall_of(
                checkpoint.name,
                oldest_hold=oldest_hold,
                oldest_unknown=oldest_unknown,
                since_progress=since,
                after=after,
            )
        )
    return stalls
