"""The feed observer's durable state (docs/design.md §8): checkpoints, receipts, alarms.

One store over three tables, each part in its own module:

* :mod:`service.store.feed_checkpoints`: where each feed is, moved only by a CAS.
* :mod:`service.store.feed_receipts`: one receipt per event, committed with its outcome;
  a hold is a receipt that is not final yet.
* :mod:`service.store.feed_alarms`: what an operator must look at.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.feed_alarms import FeedAlarms
from service.store.feed_checkpoints import FeedCheckpoints
from service.store.feed_receipts import FeedReceipts, SettlePhase
from service.store.phase import PhaseRunner

__all__ = ["FeedStore"]


class FeedStore(FeedCheckpoints, FeedReceipts, FeedAlarms):
    def __init__(
        self,
        engine: AsyncEngine,
        runner: PhaseRunner,
        *,
        settle: SettlePhase,
    ) -> None:
        """``settle``: builds the settle phase of an observation (the settlement store's own
        policy, clock and retention), so an event's settlement and its receipt share one
        transaction."""
        self._engine = engine
        self._reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._runner = runner
        self._settle = settle
