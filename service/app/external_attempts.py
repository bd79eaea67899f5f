"""An external attempt: the provider is called while a heartbeat keeps the scope's lease
(docs/design.md §5 steps 5-6).

The call is bounded by the late-response window. Past the provider timeout (or a lost
lease) the attempt settles ``unknown`` (504) and hands the call to the late answer keeper,
which settles the answer if it still arrives. A bug is not an outcome: the attempt reports
``unknown`` so a retry may run again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from service.app.answers import Answer, Problem, answer_of
from service.app.attempt_lease import Ended, LeaseKeeper
from service.app.attempt_self import answer_after, attempt_observation, settle_attempt
from service.app.effects import ExecutionContext, ExternalHandler, IdempotentRoute
from service.app.ports import LatePort, SettlementPort
from service.core import Source, Unsettled
from service.domain.payouts import ProviderUnavailable
from service.evidence import SignedEvidence, observation_of
from service.failpoints import Failpoints
from service.leases import Lease
from service.store.settlement import AttemptRef
from service.telemetry import span

__all__ = ["ExternalAttempts"]

log = logging.getLogger("settlement.attempts")


class ExternalAttempts:
    """Runs external calls under a kept lease, bounded by the provider timeout."""

    def __init__(
        self,
        *,
        store: SettlementPort,
        keeper: LeaseKeeper,
        late: LatePort,
        failpoints: Failpoints,
        provider_timeout: float,
        late_response_window: float,
    ) -> None:
        self._store = store
        self._keeper = keeper
        self._late = late
        self._failpoints = failpoints
        self._provider_timeout = provider_timeout
        self._late_window = late_response_window

    async def run(
        self,
        spec: IdempotentRoute,
        external: ExternalHandler,
        context: ExecutionContext,
        attempt: AttemptRef,
        body: Any,
        lease: Lease,
    ) -> Answer:
        operation_id, tenant = context.operation_id, context.principal.tenant
        # the call may still answer for the late-response window after the attempt gives up
        call = asyncio.create_task(
            _traced_effect(
                external(context, attempt.reservation, body),
                self._provider_timeout + self._late_window,
                operation_id=str(operation_id),
                operation_route=spec.route,
                attempt_number=attempt.fencing_token,
            )
        )
        try:
            ended = await self._keeper.under_lease(
                lease, call, give_up_after=self._provider_timeout
            )
        except BaseException:
            # the request itself is being cancelled: the call may still answer, keep it
            self._late.adopt(call, operation_id, tenant)
            raise
        if ended is not Ended.FINISHED:
            self._late.adopt(call, operation_id, tenant)
            why = "lease lost while the provider call ran"
            if ended is Ended.TIMED_OUT:
                why = f"timed out after {self._provider_timeout:g} s (SETTLEMENT_PROVIDER_TIMEOUT)"
            return await self._outcome_unknown(attempt, why, tenant)
        op = str(operation_id)
        try:
            signed = call.result()
        except ProviderUnavailable as exc:
            return await self._outcome_unknown(attempt, str(exc), tenant)
        except Exception:  # a bug is not an outcome; its details go to the log, not the client
            log.exception("external call failed", extra={"operation_id": op})
            return await self._outcome_unknown(
                attempt, "the call failed: a server error (logged)", tenant
            )
        await self._failpoints.hit("effect.before_commit")
        observation = observation_of(signed.evidence, Source.ATTEMPT)
        try:
            settled = await settle_attempt(self._store, attempt, observation, tenant=tenant)
        except Exception:
            # a definitive answer is never dropped: settle it again in the background
            log.exception("settling a provider answer failed", extra={"operation_id": op})
            self._late.settle_later(operation_id, observation, tenant)
            return Problem(
                "service-unavailable",
                "the provider answered but the outcome could not be recorded yet; retry",
                op,
                retry_after=True,
            )
        await self._failpoints.hit("effect.after_commit")
        await self._failpoints.hit("settle.after")
        return answer_of(answer_after(settled, attempt))

    async def _outcome_unknown(self, attempt: AttemptRef, why: str, tenant: str) -> Answer:
        """The attempt ends without a definitive answer: ``unknown``, safe to retry
        (``tenant``: the operation's).

        Should writing ``unknown`` fail (the database away), the client gets the same
        answer: the call is with the late answer keeper already, the row stays in_progress
        under a lease that runs out, and the lease sweeper then demotes it to ``unknown``; a
        retry with the same key meanwhile gets 409 or, once demoted, resumes. Nothing leaves
        ``handle()`` to be mapped as a server error."""
        op = attempt.reservation.operation_id
        log.warning("external outcome unknown", extra={"operation_id": op, "why": why})
        unknown = Problem(  # why goes to the log above, not to the client
            "operation-outcome-unknown",
            "the provider gave no definitive answer in time; "
            "retry with the same key: the provider never pays twice",
            op,
            state="unknown",
            retry_after=True,
        )
        try:
            settled = await settle_attempt(
                self._store, attempt, attempt_observation(attempt), error=why, tenant=tenant
            )
        except Exception as exc:
            log.warning(
                "attempt could not record unknown; the lease sweeper demotes it",
                extra={"operation_id": op, "error": repr(exc)},
            )
            return unknown
        match answer_after(settled, attempt):
            case Unsettled():
                return unknown
            case settled_meanwhile:  # a definitive answer was settled meanwhile
                return answer_of(settled_meanwhile)


async def _traced_effect(
    call: Awaitable[SignedEvidence], limit: float, **attributes: Any
) -> SignedEvidence:
    """The external call, bounded, in a ``settlement.effect`` span (which ends when the call
    does: after the attempt gave up, for a late answer)."""
    with span("settlement.effect", **attributes):
        return await _bounded(call, limit)


async def _bounded(call: Awaitable[SignedEvidence], limit: float) -> SignedEvidence:
    """Bound an external call in total time; past it there is no answer to wait for."""
    try:
        async with asyncio.timeout(limit):
            return await call
    except TimeoutError as exc:
        raise ProviderUnavailable(f"no answer within {limit:g}s") from exc
