"""The feed observer's durable state (docs/design.md §8): checkpoints, receipts, alarms.

One store over three tables, each an object of its own in its own module, which callers
reach by name (``feeds.receipts.seen(...)``):

* ``checkpoints`` (:mod:`service.store.feed_checkpoints`): where each feed is, moved only by
  a CAS.
* ``receipts`` (:mod:`service.store.feed_receipts`): one receipt per event, committed with
  its outcome; a hold is a receipt that is not final yet.
* ``alarms`` (:mod:`service.store.feed_alarms`): what an operator must look at.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.feed_alarms import FeedAlarms
from service.store.feed_checkpoints import FeedCheckpoints
from service.store.feed_receipts import FeedReceipts, SettlePhase
from service.store.phase import PhaseRunner

__all__ = ["FeedStore"]


class FeedStore:
    """A feed observer's checkpoints, receipts and alarms, on one engine."""

    def __init__(
        self,
        engine: AsyncEngine,
        runner: PhaseRunner,
        *,
        settle: SettlePhase,
    ) -> None:
        """``runner`` and ``settle``: the settlement store's phase runner and the settle
        phase of an observation (its own policy, clock and retention), so an event's
        settlement and its receipt share one transaction."""
        self.checkpoints = FeedCheckpoints(engine)
        self.receipts = FeedReceipts(engine, runner, settle=settle)
        self.alarms = FeedAlarms(engine)
