"""Late answers: a provider call that outlived its attempt is still settled when it answers.

The call was already bounded by the late-response window when it was made; this keeper only
waits for it, settles a definitive answer as a ``late_response`` observation, and forgets
it. ``close()`` cancels whatever is still outstanding, so no task outlives the process's
shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from service.core import Source
from service.domain.payouts import ProviderUnavailable
from service.evidence import SignedEvidence, observation_of
from service.store.settlement import SettlementStore
from service.telemetry import Metrics

__all__ = ["LateAnswers"]

log = logging.getLogger("settlement.late")


class LateAnswers:
    def __init__(self, store: SettlementStore, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def adopt(self, call: asyncio.Task[SignedEvidence], operation_id: uuid.UUID) -> None:
        task = asyncio.create_task(self._settle_when_answered(call, operation_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle_when_answered(
        self, call: asyncio.Task[SignedEvidence], operation_id: uuid.UUID
    ) -> None:
        try:
            signed = await call
        except ProviderUnavailable as exc:
            log.info(
                "late call ended without an answer",
                extra={"operation_id": str(operation_id), "why": str(exc)},
            )
            return
        try:
            settled = await self._store.settle(
                operation_id, observation_of(signed.evidence, Source.LATE_RESPONSE)
            )
        except Exception:
            log.exception(
                "late answer could not be settled", extra={"operation_id": str(operation_id)}
            )
            return
        self._metrics.inc("settlement_late_responses_total")
        log.info(
            "late answer settled",
            extra={
                "operation_id": str(operation_id),
                "disposition": settled.decision.disposition.value,
                "state": settled.record.state.value,
            },
        )

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
