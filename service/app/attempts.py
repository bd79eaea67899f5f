"""One claimed attempt, from its effect to its answer (DESIGN §5 steps 5-6).

Local and external effects run the same way: the work is a task, a heartbeat extends the
scope's lease while it runs, and the attempt waits for whichever comes first of the work
ending, the lease being lost, or (external only) the provider timeout.

* **local**: the effect runs inside its settlement transaction (``settle_local``). A lost
  lease cancels it, possibly mid-commit, so the answer then comes from the row: only a
  commit under this attempt's own fencing token is this attempt's outcome.
* **external**: the call is bounded by the late-response window. Past the provider timeout
  (or a lost lease) the attempt settles ``unknown`` (504) and hands the call to the late
  answer keeper, which settles the answer if it still arrives.

A bug is not an outcome: the attempt reports ``unknown`` so a retry may run again.

A database integrity error raised by a local effect (a CHECK, unique, foreign-key,
not-null or exclusion constraint refusing its writes) is not an outcome either: the
effect's transaction rolled back, so nothing of it was written. The attempt gives up
(``unknown``, or no row at all for a new operation's one statement) and the client gets
409 ``effect-refused``, safe to retry with the same key. It means an effect's own rules let
through a write its table refuses, so it is logged as an error naming the constraint.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import asyncpg

from service.app.answers import Answer, Problem, answer_of
from service.app.effects import (
    ExecutionContext,
    ExternalHandler,
    IdempotentRoute,
    LocalHandler,
    Outcome,
    business_outcome,
)
from service.app.fingerprint import result_digest
from service.app.late import LateAnswers
from service.core import (
    Apply,
    AttemptAnswer,
    ClaimRequest,
    Observation,
    ObservationKind,
    Record,
    Result,
    Scope,
    Source,
    Unsettled,
    attempt_answer,
)
from service.domain.ledger import BusinessFailure
from service.domain.payouts import ProviderUnavailable
from service.evidence import SignedEvidence, observation_of
from service.failpoints import Failpoints
from service.leases import Lease, LeaseManager
from service.store.db import DATABASE_GONE, PoolTimeout, database_gone
from service.store.outcomes import KeyExpired
from service.store.principals import Principal
from service.store.settlement import (
    AttemptRef,
    ClaimOutcome,
    EffectStatement,
    RowLocked,
    Settled,
    SettlementStore,
)
from service.telemetry import Metrics, annotate, span

__all__ = ["Attempts"]

log = logging.getLogger("settlement.attempts")

T = TypeVar("T")


# What a local attempt meets when the database is busy or away, not broken: a row lock not
# granted in the lock timeout, no pooled connection within the connect timeout, a deadlock
# PostgreSQL broke by aborting this transaction (two attempts of one operation after a lease
# takeover), or a connection lost (a restart). A retry with the same key is safe after each:
# it replays whatever committed, or runs the operation again if nothing did.
BUSY = (
    RowLocked,
    TimeoutError,
    PoolTimeout,
    asyncpg.exceptions.DeadlockDetectedError,
    *DATABASE_GONE,
)


class _Ended(enum.Enum):
    FINISHED = "finished"
    LEASE_LOST = "lease-lost"
    TIMED_OUT = "timed-out"


class Attempts:
    def __init__(
        self,
        *,
        store: SettlementStore,
        leases: LeaseManager,
        late: LateAnswers,
        failpoints: Failpoints,
        provider_timeout: float,
        late_response_window: float,
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._leases = leases
        self._late = late
        self._metrics = metrics or Metrics()
        self._failpoints = failpoints
        self._provider_timeout = provider_timeout
        self._late_window = late_response_window

    async def run(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        body: Any,
        claimed: ClaimOutcome,
        lease: Lease,
    ) -> Answer:
        """Run the claimed attempt under ``lease`` and say what its client is told."""
        started = time.perf_counter()
        attempt, context = _attempt_of(claimed, principal)
        try:
            if spec.external is not None:
                return await self._external(spec, spec.external, context, attempt, body, lease)
            assert spec.execute is not None
            return await self._local(spec, spec.execute, context, attempt, body, lease)
        finally:
            self._metrics.on_attempt(spec.route, time.perf_counter() - started)

    async def run_new_local(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        scope: Scope,
        request: ClaimRequest,
        body: Any,
        lease: Lease,
    ) -> Answer | None:
        """A scope with no row, a local route with a statement form: claim, run and settle in
        one statement while holding ``lease`` (nothing is ever left ``in_progress``: a crash or
        a lost connection leaves either the whole settled operation or nothing). None when
        nothing was written and the caller should claim and run the attempt the general
        way (the guard refused, a row appeared). ``KeyExpired`` when the key's tombstone
        stands (written by a purge that committed while this statement ran)."""
        assert spec.statement is not None
        statement_of = spec.statement
        started = time.perf_counter()

        def build(claimed: ClaimOutcome) -> EffectStatement:
            attempt, context = _attempt_of(claimed, principal)
            guard, apply, args, produced = statement_of(context, body)
            observation = _attempt_observation(attempt, ObservationKind.COMPLETED, produced)
            return EffectStatement(guard, apply, args, observation)

        op = request.new_operation_id
        # claim, effect and settlement are one statement: their spans nest around it
        with (
            span("settlement.claim", operation_route=spec.route, operation_id=op, claim_kind="new"),
            span("settlement.effect", operation_id=op, operation_route=spec.route),
            span("settlement.settle", operation_id=op, attempt_number=1) as traced,
        ):
            # No heartbeat: the statement is bounded by the lock and statement timeouts, and
            # the lease is not what keeps it single. Were the lease to run out meanwhile, a
            # second request's insert of this scope would wait for this statement's, then
            # find its row: PostgreSQL's unique scope decides.
            try:
                done = await self._store.claim_and_settle_local(
                    scope, request, build, lease_token=lease.token, route=spec.route
                )
            except (RowLocked, asyncpg.exceptions.DeadlockDetectedError):
                # a lock not granted: nothing was written; the general way claims first and
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
        attempt, _ = _attempt_of(claimed, principal)
        annotate(operation_id=op, attempt=attempt.fencing_token)
        await self._failpoints.hit("effect.after_commit")
        await self._failpoints.hit("settle.after")
        return answer_of(_answer_after(settled, attempt))

    def _unwritten(self, operation_id: str, exc: Exception) -> Answer:
        """The one statement of a new operation failed: it wrote nothing, or (a connection
        lost at COMMIT) everything; a retry with the same key runs it or replays it."""
        if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
            return _refused(operation_id, exc, state=None)
        if isinstance(exc, BUSY) or database_gone(exc):
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

    async def _settle(self, attempt: AttemptRef, observation: Observation) -> Settled:
        """Settle what this attempt observed, in a ``settlement.settle`` span."""
        op = attempt.reservation.operation_id
        with span(
            "settlement.settle", operation_id=op, attempt_number=attempt.fencing_token
        ) as traced:
            settled = await self._store.settle(
                uuid.UUID(op), observation, attempt_id=attempt.attempt_id
            )
            traced.set(
                settlement_stage=settled.decision.stage.value,
                settlement_disposition=settled.decision.disposition.value,
            )
            return settled

    async def _under_lease(
        self, lease: Lease, work: asyncio.Task[T], give_up_after: float | None
    ) -> _Ended:
        """Wait for ``work`` while a heartbeat keeps ``lease``; say how the wait ended."""
        heartbeat = self._leases.heartbeat(
            lease, before_extend=lambda: self._failpoints.hit("lease.heartbeat")
        )
        lost = asyncio.ensure_future(heartbeat.lost.wait())
        try:
            async with heartbeat:
                await asyncio.wait(
                    {work, lost}, timeout=give_up_after, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            lost.cancel()
        if work.done():
            return _Ended.FINISHED
        return _Ended.LEASE_LOST if heartbeat.lost.is_set() else _Ended.TIMED_OUT

    async def _kept_lease(self, lease: Lease, work: asyncio.Task[T]) -> bool:
        """Wait for ``work`` (a local attempt's database work) while a heartbeat keeps
        ``lease``; False when the lease was lost first (``work`` is then cancelled, possibly
        mid-commit, and done)."""
        try:
            ended = await self._under_lease(lease, work, give_up_after=None)
        except BaseException:
            work.cancel()  # the request itself is being cancelled
            raise
        if ended is _Ended.LEASE_LOST:
            work.cancel()
            await asyncio.wait({work})
            return False
        return True

    # -- local --------------------------------------------------------------------------------

    async def _local(
        self,
        spec: IdempotentRoute,
        execute: LocalHandler,
        context: ExecutionContext,
        attempt: AttemptRef,
        body: Any,
        lease: Lease,
    ) -> Answer:
        op = str(context.operation_id)
        number = attempt.fencing_token

        async def effect(conn: asyncpg.Connection, current: Record) -> Observation:
            with span(
                "settlement.effect",
                operation_id=op,
                operation_route=spec.route,
                attempt_number=number,
            ):
                try:
                    produced = await execute(conn, context, body)
                    kind = ObservationKind.COMPLETED
                except BusinessFailure as failure:
                    produced = business_outcome(failure, context.operation_id)
                    kind = ObservationKind.FAILED
            return _attempt_observation(attempt, kind, produced)

        statement = None
        if spec.statement is not None:
            guard, apply, args, produced = spec.statement(context, body)
            observation = _attempt_observation(attempt, ObservationKind.COMPLETED, produced)
            statement = EffectStatement(guard, apply, args, observation)

        async def settle() -> Settled:
            # the local effect runs inside its settlement's transaction: its span is a child
            with span("settlement.settle", operation_id=op, attempt_number=number) as traced:
                settled = await self._store.settle_local(
                    context.operation_id,
                    attempt,
                    effect,
                    route=spec.route,
                    before_commit=lambda: self._failpoints.hit("effect.before_commit"),
                    statement=statement,
                )
                traced.set(
                    settlement_stage=settled.decision.stage.value,
                    settlement_disposition=settled.decision.disposition.value,
                )
                return settled

        work = asyncio.create_task(settle())
        if not await self._kept_lease(lease, work):
            return await self._after_lost_lease(attempt)
        try:
            settled = work.result()
        except BUSY as exc:
            return await self._busy(attempt, context, exc)
        except asyncpg.IntegrityConstraintViolationError as exc:
            await self._give_up(attempt)
            return _refused(str(context.operation_id), exc, state="unknown")
        except Exception as exc:
            if database_gone(exc):  # wrapped where BUSY cannot see it: busy, not a bug
                return await self._busy(attempt, context, exc)
            log.exception("attempt failed", extra={"operation_id": str(context.operation_id)})
            await self._give_up(attempt)
            op = str(context.operation_id)
            return Problem(
                "internal-error",
                "the attempt failed before its outcome was known; safe to retry",
                op,
                state="unknown",
            )
        await self._failpoints.hit("effect.after_commit")
        await self._failpoints.hit("settle.after")
        return answer_of(_answer_after(settled, attempt))

    # -- external -----------------------------------------------------------------------------

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
        try:  # the give-up needs the database too; if it is away, the sweeper demotes later
            await self._give_up(attempt)
        except Exception as failed:
            if not isinstance(failed, BUSY) and not database_gone(failed):
                raise
        return Problem(
            "service-unavailable",
            f"the database was busy or unreachable ({type(exc).__name__}); retry with the same key",
            op,
            state="unknown",
            retry_after=True,
        )

    async def _external(
        self,
        spec: IdempotentRoute,
        external: ExternalHandler,
        context: ExecutionContext,
        attempt: AttemptRef,
        body: Any,
        lease: Lease,
    ) -> Answer:
        operation_id = context.operation_id
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
            ended = await self._under_lease(lease, call, give_up_after=self._provider_timeout)
        except BaseException:
            # the request itself is being cancelled: the call may still answer, keep it
            self._late.adopt(call, operation_id)
            raise
        if ended is not _Ended.FINISHED:
            self._late.adopt(call, operation_id)
            return await self._outcome_unknown(attempt, "no answer in time")
        op = str(operation_id)
        try:
            signed = call.result()
        except ProviderUnavailable as exc:
            return await self._outcome_unknown(attempt, str(exc))
        except Exception:  # a bug is not an outcome; its details go to the log, not the client
            log.exception("external call failed", extra={"operation_id": op})
            return await self._outcome_unknown(attempt, "the call failed")
        await self._failpoints.hit("effect.before_commit")
        observation = observation_of(signed.evidence, Source.ATTEMPT)
        try:
            settled = await self._settle(attempt, observation)
        except Exception:
            # a definitive answer is never dropped: settle it again in the background
            log.exception("settling a provider answer failed", extra={"operation_id": op})
            self._late.settle_later(operation_id, observation)
            return Problem(
                "service-unavailable",
                "the provider answered but the outcome could not be recorded yet; retry",
                op,
                retry_after=True,
            )
        await self._failpoints.hit("effect.after_commit")
        await self._failpoints.hit("settle.after")
        return answer_of(_answer_after(settled, attempt))

    # -- endings without an outcome -----------------------------------------------------------

    async def _outcome_unknown(self, attempt: AttemptRef, why: str) -> Answer:
        """The attempt ends without a definitive answer: ``unknown``, safe to retry."""
        op = attempt.reservation.operation_id
        log.warning("external outcome unknown", extra={"operation_id": op, "why": why})
        settled = await self._settle(attempt, _attempt_observation(attempt))
        match _answer_after(settled, attempt):
            case Unsettled():
                return Problem(  # why goes to the log above, not to the client
                    "operation-outcome-unknown",
                    "the provider gave no definitive answer in time; "
                    "retry with the same key: the provider never pays twice",
                    op,
                    state="unknown",
                    retry_after=True,
                )
            case settled_meanwhile:  # a definitive answer was settled meanwhile
                return answer_of(settled_meanwhile)

    async def _after_lost_lease(self, attempt: AttemptRef) -> Answer:
        """The lease was lost and the attempt cancelled, possibly mid-commit: say what the row
        says. Only a commit under this attempt's own fencing token is this attempt's outcome."""
        op = attempt.reservation.operation_id
        log.warning("lease lost during execution", extra={"operation_id": op})
        record = None
        with contextlib.suppress(Exception):
            record = await self._store.get(uuid.UUID(op))
        if record is not None:
            answer = attempt_answer(
                record,
                stored_by_attempt=record.fencing_token == attempt.fencing_token,
                epoch=attempt.reservation.binding_generation,
            )
            if not isinstance(answer, Unsettled):
                return answer_of(answer)
        await self._give_up(attempt)  # ignored if another attempt took over
        return Problem(
            "lease-unavailable",
            "this attempt lost its lease before its outcome committed; retry",
            op,
            retry_after=True,
        )

    async def _give_up(self, attempt: AttemptRef) -> None:
        """A bug is not an outcome: the attempt reports ``unknown`` so a retry may run again."""
        with contextlib.suppress(Exception):
            await self._settle(attempt, _attempt_observation(attempt))


def _refused(
    operation_id: str, exc: asyncpg.IntegrityConstraintViolationError, *, state: str | None
) -> Problem:
    """A local effect's writes refused by a constraint of their tables: nothing was written
    (its transaction rolled back); a retry with the same key runs the effect again."""
    constraint = getattr(exc, "constraint_name", None) or type(exc).__name__
    log.error(
        "effect refused by the database",
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"operation_id": operation_id, "constraint": constraint},
    )
    return Problem(
        "effect-refused",
        f"the database refused the effect's writes ({constraint}); nothing was written, "
        "retry with the same key",
        operation_id,
        state=state,
        retry_after=True,
    )


def _attempt_observation(
    attempt: AttemptRef,
    kind: ObservationKind = ObservationKind.UNKNOWN,
    produced: Outcome | None = None,
) -> Observation:
    """What this attempt reports about itself, under its own fencing token."""
    result = None
    if produced is not None:
        result = Result(
            status=produced.status,
            content_type=produced.content_type,
            body=produced.body,
            digest=result_digest(produced.status, produced.content_type, produced.body),
        )
    return Observation(
        reservation=attempt.reservation,
        kind=kind,
        source=Source.ATTEMPT,
        fencing_token=attempt.fencing_token,
        result=result,
    )


def _answer_after(settled: Settled, attempt: AttemptRef) -> AttemptAnswer:
    """What the row says after this attempt's own settlement: ``replayed`` unless it stored
    the outcome; superseded if the row is of a later epoch than the attempt."""
    stored = isinstance(settled.decision, Apply) and settled.record.state.terminal
    return attempt_answer(
        settled.record, stored_by_attempt=stored, epoch=attempt.reservation.binding_generation
    )


def _attempt_of(claimed: ClaimOutcome, principal: Principal) -> tuple[AttemptRef, ExecutionContext]:
    """What a freshly claimed attempt knows about itself."""
    record = claimed.record
    assert record is not None and claimed.attempt_id is not None
    attempt = AttemptRef(
        attempt_id=claimed.attempt_id,
        reservation=record.reservation,
        fencing_token=record.fencing_token,
        claimed=record,
    )
    context = ExecutionContext(
        principal=principal,
        operation_id=uuid.UUID(record.reservation.operation_id),
        binding_generation=record.reservation.binding_generation,
    )
    return attempt, context


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
