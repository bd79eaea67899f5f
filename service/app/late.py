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
from collections.abc import Coroutine
from typing import Any

from service.app.ports import SettlementPort
from service.core import Observation, Source
from service.domain.payouts import ProviderUnavailable
from service.evidence import SignedEvidence, observation_of
from service.telemetry import Metrics

__all__ = ["LateAnswers"]

log = logging.getLogger("settlement.late")

# Re-settling a definitive answer: 0.5 s, 1 s, 2 s, 4 s, 8 s; a retry by the client with the
# same key recovers the outcome through the sink key after that anyway.
RETRY_FIRST_DELAY = 0.5
RETRY_ATTEMPTS = 5


class LateAnswers:
    def __init__(self, store: SettlementPort, metrics: Metrics) -> None:
        self._store = store
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def adopt(
        self, call: asyncio.Task[SignedEvidence], operation_id: uuid.UUID, tenant: str | None = None
    ) -> None:
        """Settle the call's answer when it comes (``tenant``: the operation's; None: found
        from its id)."""
        if self._closed:
            call.cancel()
            return
        self._track(self._settle_when_answered(call, operation_id, tenant))

    def settle_later(
        self, operation_id: uuid.UUID, observation: Observation, tenant: str | None = None
    ) -> None:
        """Retry settling a definitive answer whose first settlement failed."""
        if not self._closed:
            self._track(self._retry(operation_id, observation, tenant))

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retry(
        self, operation_id: uuid.UUID, observation: Observation, tenant: str | None
    ) -> None:
        delay = RETRY_FIRST_DELAY
        for attempt in range(1, RETRY_ATTEMPTS + 1):
            await asyncio.sleep(delay)
            try:
                await self._store.settle(operation_id, observation, tenant=tenant)
                return
            except Exception as exc:
                log.warning(
                    "settling an answer failed again",
                    extra={"operation_id": str(operation_id), "try": attempt, "error": repr(exc)},
                )
            delay *= 2
        log.error("gave up settling an answer", extra={"operation_id": str(operation_id)})

    async def _settle_when_answered(
        self, call: asyncio.Task[SignedEvidence], operation_id: uuid.UUID, tenant: str | None
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
                operation_id, observation_of(signed.evidence, Source.LATE_RESPONSE), tenant=tenant
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
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
