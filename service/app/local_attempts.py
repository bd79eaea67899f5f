"""A local attempt: the effect runs inside its settlement transaction (docs/design.md §5
steps 5-6). A new operation's one statement holds no lease (:meth:`LocalAttempts.run_new_local`);
on the locked path a heartbeat keeps the scope's lease meanwhile.

A lost lease cancels it, possibly mid-commit, so the answer then comes from the row: only a
commit under this attempt's own fencing token is this attempt's outcome. A scope with no
row may claim, run and settle in one statement (:meth:`LocalAttempts.run_new_local`).

A bug is not an outcome: the attempt reports ``unknown`` so a retry may run again.

A constraint of the database refusing a local effect's writes (``EffectRefused``: a
CHECK, unique, foreign-key, not-null or exclusion constraint) is not an outcome either: the
effect's transaction rolled back, so nothing of it was written. The attempt gives up
(``unknown``, or no row at all for a new operation's one statement) and the client gets
409 ``effect-refused``, safe to retry with the same key. It means an effect's own rules let
through a write its table refuses, so it is logged as an error naming the constraint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

from service.app.answers import Answer, Problem, answer_of
from service.app.attempt_lease import LeaseKeeper
from service.app.attempt_self import answer_after, attempt_observation, attempt_of, settle_attempt
from service.app.effects import (
    ExecutionContext,
    IdempotentRoute,
    StatementHandler,
    business_outcome,
)
from service.app.ports import SettlementPort
from service.core import (
    ClaimRequest,
    Observation,
    ObservationKind,
    Scope,
    Unsettled,
    attempt_answer,
)
from service.domain.principals import Principal
from service.failpoints import Failpoints
from service.leases import Lease
from service.store.db import DatabaseUnavailable
from service.store.outcomes import EffectRefused, KeyExpired
from service.store.settlement import (
    AttemptRef,
    ClaimOutcome,
    EffectStatement,
    RowLocked,
    Settled,
)
from service.telemetry import Metrics, annotate, span

__all__ = ["LocalAttempts"]

log = logging.getLogger("settlement.attempts")


# What a local attempt meets when the database is busy or away, not broken: a row lock not
# granted in the lock timeout or a deadlock PostgreSQL broke by aborting this transaction
# (two attempts of one operation after a lease takeover; the store says RowLocked for both),
# no pooled connection within the connect timeout, or a connection lost (a restart: the store
# says DatabaseUnavailable for both). A retry with the same key is safe after each: it replays
# whatever committed, or runs the operation again if nothing did.
BUSY: tuple[type[BaseException], ...] = (RowLocked, TimeoutError, DatabaseUnavailable)


class LocalAttempts:
    """Runs local effects in their settlement transactions, under a kept lease."""

    def __init__(
        self,
        *,
        store: SettlementPort,
        keeper: LeaseKeeper,
        failpoints: Failpoints,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._keeper = keeper
        self._failpoints = failpoints
        self._metrics = metrics

    async def run_new_local(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        scope: Scope,
        request: ClaimRequest,
        body: Any,
        *,
        lease_token: str | None,
    ) -> Answer | None:
        """A scope with no row, a local route with a statement form: claim, run and settle in
        one statement (nothing is ever left ``in_progress``: a crash or a lost connection
        leaves either the whole settled operation or nothing; ``lease_token``: the lease it
        holds, None when it holds none). None when
        nothing was written and the caller should claim, then settle under the row's lock (a
        row appeared, a lock was not granted). ``KeyExpired`` when the key's tombstone
        stands (written by a purge that committed while this statement ran)."""
        assert spec.statement is not None
        statement_of = spec.statement
        started = time.perf_counter()

        def build(claimed: ClaimOutcome) -> EffectStatement:
            attempt, context = attempt_of(claimed, principal)
            return _effect_statement(statement_of, context, attempt, body)

        op = request.new_operation_id
        # claim, effect and settlement are one statement: their spans nest around it
        with (
            span("settlement.claim", operation_route=spec.route, operation_id=op, claim_kind="new"),
            span("settlement.effect", operation_id=op, operation_route=spec.route),
            span("settlement.settle", operation_id=op, attempt_number=1) as traced,
        ):
            # No lease and no heartbeat: the statement is bounded by the lock and statement
            # timeouts, and a lease is not what keeps it single. A second request's insert of
            # this scope waits for this statement's, then finds its row: PostgreSQL's unique
            # scope decides.
            try:
                await self._failpoints.hit("effect.before_statement")  # nothing written yet
                done = await self._store.claim_and_settle_local(
                    scope, request, build, lease_token=lease_token, route=spec.route
                )
            except RowLocked:
                # a lock not granted: nothing was written; the locked path claims first and
                # waits once more (a lock freed meanwhile runs the transfer after all)
                return None
            except KeyExpired:
                raise  # the key's operation was purged: 410, nothing written
            except Exception as exc:
                return self._unwritten(op, exc)
            if done is None:
                return None
            claimed, settled = done
            traced.set(
                settlement_stage=settled.decision.stage.value,
                settlement_disposition=settled.decision.disposition.value,
            )
        self._metrics.on_attempt(spec.route, time.perf_counter() - started)
        attempt, _ = attempt_of(claimed, principal)
        annotate(operation_id=op, attempt=attempt.fencing_token)
        await self._failpoints.hit("effect.after_commit")
        await self._failpoints.hit("settle.after")
        return answer_of(answer_after(settled, attempt))

    def _unwritten(self, operation_id: str, exc: Exception) -> Answer:
        """The one statement of a new operation failed: it wrote nothing, or (a connection
        lost at COMMIT) everything; a retry with the same key runs it or replays it."""
        if isinstance(exc, EffectRefused):
            return _refused(operation_id, exc, state=None)
        if isinstance(exc, BUSY):
            log.warning(
                "new operation found the database busy or away",
                extra={"operation_id": operation_id, "error": type(exc).__name__},
            )
            return Problem(
                "service-unavailable",
                f"the database was busy or unreachable ({type(exc).__name__}); retry with "
                "the same key",
                operation_id,
                retry_after=True,
            )
        log.error(
            "new operation failed",
            exc_info=(type(exc), exc, exc.__traceback__),
            extra={"operation_id": operation_id},
        )
        return Problem(
            "internal-error",
            "the attempt failed before its outcome was known; safe to retry",
            operation_id,
        )

    async def run(
        self,
        spec: IdempotentRoute,
        statement_of: StatementHandler,
        context: ExecutionContext,
        attempt: AttemptRef,
        body: Any,
        lease: Lease,
    ) -> Answer:
        op = str(context.operation_id)
        number = attempt.fencing_token
        statement = _effect_statement(statement_of, context, attempt, body)

        async def settle() -> Settled:
            # the local effect runs inside its settlement's transaction: their spans nest
            with (
                span(
                    "settlement.effect",
                    operation_id=op,
                    operation_route=spec.route,
                    attempt_number=number,
                ),
                span("settlement.settle", operation_id=op, attempt_number=number) as traced,
            ):
                settled = await self._store.settle_local(
                    context.operation_id,
                    attempt,
                    statement,
                    tenant=context.principal.tenant,
                    route=spec.route,
                    before_commit=lambda: self._failpoints.hit("effect.before_commit"),
                )
                traced.set(
                    settlement_stage=settled.decision.stage.value,
                    settlement_disposition=settled.decision.disposition.value,
                )
                return settled

        work = asyncio.create_task(settle())
        if not await self._keeper.kept_lease(lease, work):
            return await self._after_lost_lease(attempt)
        try:
            settled = work.result()
        except BUSY as exc:
            return await self._busy(attempt, context, exc)
        except EffectRefused as exc:
            await self._give_up(attempt, str(exc))  # "the database refused ... (constraint)"
            return _refused(str(context.operation_id), exc, state="unknown")
        except Exception:
            log.exception("attempt failed", extra={"operation_id": str(context.operation_id)})
            await self._give_up(attempt, "the attempt failed: a server error (logged)")
            op = str(context.operation_id)
            return Problem(
                "internal-error",
                "the attempt failed before its outcome was known; safe to retry",
                op,
                state="unknown",
            )
        await self._failpoints.hit("effect.after_commit")
        await self._failpoints.hit("settle.after")
        return answer_of(answer_after(settled, attempt))

    async def _busy(
        self, attempt: AttemptRef, context: ExecutionContext, exc: BaseException
    ) -> Answer:
        """A row the effect needs stayed locked, no connection came free, or the connection
        was lost: the attempt gives up so a retry runs (or replays what a COMMIT in flight may
        have written)."""
        op = str(context.operation_id)
        log.warning(
            "attempt found the database busy or away",
            extra={"operation_id": op, "error": type(exc).__name__},
        )
        await self._give_up(attempt, f"the database was busy or unreachable ({type(exc).__name__})")
        return Problem(
            "service-unavailable",
            f"the database was busy or unreachable ({type(exc).__name__}); retry with the same key",
            op,
            state="unknown",
            retry_after=True,
        )

    async def _after_lost_lease(self, attempt: AttemptRef) -> Answer:
        """The lease was lost and the attempt cancelled, possibly mid-commit: say what the row
        says. Only a commit under this attempt's own fencing token is this attempt's outcome."""
        op = attempt.reservation.operation_id
        log.warning("lease lost during execution", extra={"operation_id": op})
        record = None
        with contextlib.suppress(Exception):
            record = await self._store.reads.get(uuid.UUID(op))
        if record is not None:
            answer = attempt_answer(
                record,
                stored_by_attempt=record.fencing_token == attempt.fencing_token,
                epoch=attempt.reservation.binding_generation,
            )
            if not isinstance(answer, Unsettled):
                return answer_of(answer)
        # ignored if another attempt took over
        await self._give_up(attempt, "lease lost before the outcome committed")
        return Problem(
            "lease-unavailable",
            "this attempt lost its lease before its outcome committed; retry",
            op,
            retry_after=True,
        )

    async def _give_up(self, attempt: AttemptRef, why: str) -> None:
        """A bug is not an outcome: the attempt reports ``unknown`` so a retry may run again;
        ``why``: its error, in an operator's words.
        The report needs the database too: when it cannot be made (the database away, or
        anything else), the row stays ``in_progress`` until its lease runs out and the
        sweeper demotes it; the answer does not change, so it is logged, not raised."""
        try:
            await settle_attempt(self._store, attempt, attempt_observation(attempt), error=why)
        except Exception as failed:
            log.warning(
                "attempt could not report unknown; the sweeper demotes it",
                extra={"operation_id": attempt.reservation.operation_id, "error": repr(failed)},
            )


def _effect_statement(
    statement_of: StatementHandler, context: ExecutionContext, attempt: AttemptRef, body: Any
) -> EffectStatement:
    """The route's effect as SQL for ``attempt``: what it reports when the effect applies,
    and when the effect's guard refuses it (a ``failed`` outcome: the refusal's problem)."""
    effect, params, produced = statement_of(context, body)

    def refused(slug: str, detail: str) -> Observation:
        failure = business_outcome(slug, detail, context.operation_id)
        return attempt_observation(attempt, ObservationKind.FAILED, failure)

    completed = attempt_observation(attempt, ObservationKind.COMPLETED, produced)
    return EffectStatement(effect, params, completed, refused)


def _refused(operation_id: str, exc: EffectRefused, *, state: str | None) -> Problem:
    """A local effect's writes refused by a constraint of their tables: nothing was written
    (its transaction rolled back); a retry with the same key runs the effect again. For a
    new operation's one statement (``state`` None) the id is the one it would have had: no
    row holds it."""
    log.error(
        "effect refused by the database",
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"operation_id": operation_id, "constraint": exc.constraint},
    )
    return Problem(
        "effect-refused",
        f"the database refused the effect's writes ({exc.constraint}); nothing was written, "
        "retry with the same key",
        operation_id,
        state=state,
        retry_after=True,
    )
