"""The lease sweeper: in_progress operations whose worker died become ``unknown``.

A background loop in every server process (``run``), and ``settlement sweep`` for one pass
(``run_once``). Batches are bounded: found across tenants without a lock, then taken tenant
by tenant, each tenant's rows in a transaction of its own with ``FOR UPDATE SKIP LOCKED``, so
any number of processes can sweep at once. A row is demoted only when its lease is gone
from Redis too; if Redis cannot be asked, nothing is demoted (fail closed).
"""

from __future__ import annotations

import asyncio
import logging

from service.core import Scope
from service.leases import LeaseManager
from service.store.settlement import SettlementStore, SweepCursor
from service.telemetry import Metrics

__all__ = ["SWEEP_BATCH", "Sweeper"]

log = logging.getLogger("settlement.sweeper")

# Rows per transaction: keeps each sweep's locks and its Redis round trips short.
SWEEP_BATCH = 100


class Sweeper:
    def __init__(
        self,
        store: SettlementStore,
        leases: LeaseManager,
        metrics: Metrics,
        *,
        interval: float,
        batch: int = SWEEP_BATCH,
    ) -> None:
        self._store = store
        self._leases = leases
        self._metrics = metrics
        self._interval = interval
        self._batch = batch
        self._cursor: SweepCursor | None = None

    async def _remaining(self, scopes: list[Scope]) -> list[float | None]:
        return await self._leases.remaining_many([scope.lease_name() for scope in scopes])

    @property
    def more(self) -> bool:
        """Whether the last batch was full, so the next one continues after it."""
        return self._cursor is not None

    async def run_once(self) -> int:
        """One bounded batch (continuing after the previous one); the number demoted."""
        page = await self._store.sweep(self._batch, self._remaining, self._cursor)
        self._cursor = page.next
        demoted = page.demoted
        for operation_id in demoted:
            log.warning(
                "demoted an in_progress operation whose lease expired",
                extra={"operation_id": str(operation_id)},
            )
        if demoted:
            self._metrics.inc("settlement_sweeper_demotions_total", len(demoted))
        return len(demoted)

    async def run(self) -> None:
        """Sweep every ``interval`` seconds until cancelled; errors are logged, not fatal."""
        while True:
            try:
                await self.run_once()
                while self.more:  # a full batch: go on after it right away
                    await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("sweep failed; will retry", extra={"error": repr(exc)})
            await asyncio.sleep(self._interval)
