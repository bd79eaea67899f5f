"""The Idempotency-Key layer, opt-in per route (DESIGN §5 steps 1-7).

A route becomes idempotent by declaring an :class:`IdempotentRoute` and handing its requests
to :meth:`Idempotency.handle`:

1. authenticate, parse the key, decode and validate the body (400, nothing stored),
   fingerprint it;
2. one indexed read of the scope's row: replay a terminal match; 422 / 409 for a mismatch
   or a conflict;
3. acquire the scope's Redis lease (held by a live attempt: 409 or ``Prefer: wait``);
4. claim in PostgreSQL with one CAS (new, from unknown, or demoting a stale in_progress),
   which creates the attempt row and its fencing token;
5. run the effect under a heartbeat; a lost lease cancels it;
6. settle: a local effect commits in the settlement transaction, fenced by the token;
7. release the lease and answer with ``Idempotent-Replayed: false``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import ClientException
from sqlalchemy.ext.asyncio import AsyncConnection

from service.core import (
    Binding,
    Claim,
    ClaimRequest,
    InProgress,
    Observation,
    ObservationKind,
    OperationConflict,
    Record,
    ReservationTuple,
    Result,
    Source,
    decide_claim,
)
from service.domain.ledger import BusinessFailure
from service.domain.payouts import ProviderUnavailable
from service.evidence import SignedEvidence, observation_of
from service.http.answers import (
    Outcome,
    answer,
    business_outcome,
    busy,
    fresh,
    prefer_wait,
    result_response,
)
from service.http.auth import AuthError, authenticate, require_role
from service.http.fingerprint import KeyError_, fingerprint, parse_idempotency_key, result_digest
from service.http.problems import problem_response
from service.leases import Lease, LeaseUnavailable
from service.store.principals import Principal, Role
from service.store.rows import Scope
from service.store.settlement import (
    AttemptRef,
    ClaimOutcome,
    RowLocked,
    Settled,
    SettlementContention,
)

__all__ = ["ExecutionContext", "Idempotency", "IdempotentRoute", "Outcome"]

log = logging.getLogger("settlement.idempotency")


@dataclass(frozen=True, slots=True)
class ExecutionContext:
    principal: Principal
    operation_id: uuid.UUID
    binding_generation: int


LocalHandler = Callable[[AsyncConnection, ExecutionContext, Any], Awaitable[Outcome]]
# An external effect sends the request downstream and returns verified evidence of a
# definitive answer, or raises ProviderUnavailable when there is none.
ExternalHandler = Callable[[ExecutionContext, ReservationTuple, Any], Awaitable[SignedEvidence]]


@dataclass(frozen=True, slots=True)
class IdempotentRoute:
    """Declares a route idempotent: its scope name, body schema, roles and its effect,
    either local (commits with the settlement) or external (settled from evidence)."""

    route: str
    body_type: type[msgspec.Struct]
    execute: LocalHandler | None = None
    external: ExternalHandler | None = None
    roles: tuple[Role, ...] = (Role.CLIENT, Role.ADMIN)

    def __post_init__(self) -> None:
        if (self.execute is None) == (self.external is None):
            raise ValueError(f"{self.route}: declare exactly one of execute or external")


class Idempotency:
    def __init__(self, runtime: Any) -> None:
        self._rt = runtime

    # -- step 1 ----------------------------------------------------------------------------

    async def handle(
        self,
        request: Request[Any, Any, Any],
        spec: IdempotentRoute,
        path_params: dict[str, Any] | None = None,
    ) -> Response[bytes]:
        try:
            principal = await authenticate(request)
            require_role(principal, *spec.roles)
            key = parse_idempotency_key(request.headers.getall("idempotency-key", []))
        except (AuthError, KeyError_) as exc:
            return fresh(problem_response(exc.slug, exc.detail))
        try:
            raw = await request.body()
        except ClientException as exc:
            if exc.status_code != 413:
                raise
            return fresh(problem_response("payload-too-large", str(exc.detail)))
        try:
            body = msgspec.json.decode(raw, type=spec.body_type)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return fresh(problem_response("validation-error", str(exc)))
        scope = Scope(
            tenant=principal.tenant,
            principal_id=principal.id,
            route=spec.route,
            idempotency_key=key,
        )
        claim = ClaimRequest(
            request_fingerprint=fingerprint(spec.route, path_params or {}, body),
            binding=Binding(str(principal.id), principal.credential_generation),
            new_operation_id=str(uuid.uuid4()),
            lease_expires_at=time.time() + self._rt.settings.lease_ttl,
        )
        try:
            return await self._run(request, spec, principal, scope, claim, body)
        except RowLocked:
            return busy(scope)
        except SettlementContention as exc:
            return fresh(
                problem_response("service-unavailable", str(exc), headers={"Retry-After": "1"})
            )

    # -- steps 2-7 -------------------------------------------------------------------------

    async def _run(
        self,
        request: Request[Any, Any, Any],
        spec: IdempotentRoute,
        principal: Principal,
        scope: Scope,
        claim: ClaimRequest,
        body: Any,
    ) -> Response[bytes]:
        store = self._rt.store
        record = await store.get_by_scope(scope)
        if record is not None:
            early = decide_claim(record, claim, time.time())
            if not isinstance(early, Claim | InProgress):
                return answer(early)
        try:
            lease = await self._rt.leases.acquire(scope.lease_name())
        except LeaseUnavailable:
            op = None if record is None else record.tuple.operation_id
            return fresh(
                problem_response(
                    "lease-unavailable",
                    "the lease store is unreachable; no new execution without a lease",
                    headers={"Retry-After": "1"},
                    operation_id=op,
                ),
                op,
            )
        if lease is None:
            return await self._in_progress(request, scope, claim, record)
        try:
            outcome: ClaimOutcome = await store.claim(
                scope,
                claim,
                lease_token=lease.token,
                lease_held=True,
                assume_absent=record is None,
            )
            if not isinstance(outcome.decision, Claim):
                return answer(outcome.decision)
            await self._rt.failpoints.hit("claim.after")
            if spec.external is not None:
                return await self._execute_external(spec, principal, body, outcome, lease)
            return await self._execute(spec, principal, body, outcome, lease)
        finally:
            with contextlib.suppress(LeaseUnavailable):
                await self._rt.leases.release(lease)

    async def _execute(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        body: Any,
        claimed: ClaimOutcome,
        lease: Lease,
    ) -> Response[bytes]:
        operation_id, attempt, context = _attempt_of(claimed, principal)
        failpoints = self._rt.failpoints

        execute = spec.execute
        assert execute is not None

        async def effect(conn: AsyncConnection, current: Record) -> Observation:
            try:
                produced = await execute(conn, context, body)
                kind = ObservationKind.COMPLETED
            except BusinessFailure as failure:
                produced = business_outcome(failure, operation_id)
                kind = ObservationKind.FAILED
            return Observation(
                tuple=attempt.reservation,
                kind=kind,
                source=Source.ATTEMPT,
                fencing_token=attempt.fencing_token,
                result=Result(
                    status=produced.status,
                    content_type=produced.content_type,
                    body=produced.body,
                    digest=result_digest(produced.status, produced.content_type, produced.body),
                ),
            )

        task = asyncio.create_task(
            self._rt.store.settle_local(
                operation_id,
                attempt,
                effect,
                before_commit=lambda: failpoints.hit("effect.before_commit"),
            )
        )
        heartbeat = self._rt.leases.heartbeat(
            lease,
            on_lost=task.cancel,
            before_extend=lambda: failpoints.hit("lease.heartbeat"),
        )
        try:
            async with heartbeat:
                settled: Settled = await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if not heartbeat.lost.is_set() or (me is not None and me.cancelling()):
                raise  # the request itself was cancelled
            return await self._after_lost_lease(operation_id, attempt)
        except Exception:
            log.exception("attempt failed", extra={"operation_id": str(operation_id)})
            await self._give_up(operation_id, attempt)
            return fresh(
                problem_response(
                    "internal-error",
                    "the attempt failed before its outcome was known; safe to retry",
                    operation_id=str(operation_id),
                    state="unknown",
                ),
                str(operation_id),
            )
        await failpoints.hit("effect.after_commit")
        await failpoints.hit("settle.after")
        return self._settled_response(settled, str(operation_id))

    async def _execute_external(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        body: Any,
        claimed: ClaimOutcome,
        lease: Lease,
    ) -> Response[bytes]:
        """Send downstream under the sink key; settle the answer as an observation.

        The call runs as its own task bounded by the late-response window. The attempt waits
        at most the provider timeout (or until its lease is lost); past that it settles
        ``unknown`` (504) and hands the call to the late-answer keeper, which settles the
        answer if it still arrives.
        """
        assert spec.external is not None
        operation_id, attempt, context = _attempt_of(claimed, principal)
        settings = self._rt.settings
        failpoints = self._rt.failpoints
        # the call may still answer for late_response_window after the attempt gives up
        call = asyncio.create_task(
            _bounded(
                spec.external(context, attempt.reservation, body),
                settings.provider_timeout + settings.late_response_window,
            )
        )
        heartbeat = self._rt.leases.heartbeat(
            lease, before_extend=lambda: failpoints.hit("lease.heartbeat")
        )
        lost = asyncio.ensure_future(heartbeat.lost.wait())
        try:
            async with heartbeat:
                await asyncio.wait(
                    {call, lost},
                    timeout=settings.provider_timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        except BaseException:
            # the request itself is being cancelled: the call may still answer, keep it
            self._rt.late.adopt(call, operation_id)
            raise
        finally:
            lost.cancel()
        op = str(operation_id)
        if not call.done():
            self._rt.late.adopt(call, operation_id)
            return await self._outcome_unknown(operation_id, attempt, "no answer in time")
        try:
            signed = call.result()
        except ProviderUnavailable as exc:
            return await self._outcome_unknown(operation_id, attempt, str(exc))
        except Exception as exc:  # a bug is not an outcome
            log.exception("external call failed", extra={"operation_id": op})
            return await self._outcome_unknown(operation_id, attempt, repr(exc))
        await failpoints.hit("effect.before_commit")
        observation = observation_of(signed.evidence, Source.ATTEMPT)
        try:
            settled = await self._rt.store.settle(
                operation_id, observation, attempt_id=attempt.attempt_id
            )
        except Exception:
            # a definitive answer is never dropped: settle it again in the background
            log.exception("settling a provider answer failed", extra={"operation_id": op})
            self._rt.late.settle_later(operation_id, observation)
            return fresh(
                problem_response(
                    "service-unavailable",
                    "the provider answered but the outcome could not be recorded yet; retry",
                    headers={"Retry-After": "1"},
                    operation_id=op,
                ),
                op,
            )
        await failpoints.hit("effect.after_commit")
        await failpoints.hit("settle.after")
        return self._settled_response(settled, op)

    async def _outcome_unknown(
        self, operation_id: uuid.UUID, attempt: AttemptRef, why: str
    ) -> Response[bytes]:
        """The attempt ends without a definitive answer: ``unknown``, safe to retry."""
        log.warning(
            "external outcome unknown", extra={"operation_id": str(operation_id), "why": why}
        )
        settled = await self._rt.store.settle(
            operation_id,
            Observation(
                tuple=attempt.reservation,
                kind=ObservationKind.UNKNOWN,
                source=Source.ATTEMPT,
                fencing_token=attempt.fencing_token,
            ),
            attempt_id=attempt.attempt_id,
        )
        if settled.record.state.terminal:  # a definitive answer was settled meanwhile
            return self._settled_response(settled, str(operation_id))
        return fresh(
            problem_response(
                "operation-outcome-unknown",
                f"the provider gave no definitive answer ({why}); "
                "retry with the same key: the provider never pays twice",
                headers={"Retry-After": "1"},
                operation_id=str(operation_id),
                state="unknown",
            ),
            str(operation_id),
        )

    async def _after_lost_lease(
        self, operation_id: uuid.UUID, attempt: AttemptRef
    ) -> Response[bytes]:
        """The lease was lost and the attempt cancelled, possibly mid-commit: say what the row
        says. Only a commit under this attempt's own fencing token is this attempt's outcome."""
        log.warning("lease lost during execution", extra={"operation_id": str(operation_id)})
        op = str(operation_id)
        record = None
        with contextlib.suppress(Exception):
            record = await self._rt.store.get(operation_id)
        if record is not None and record.state.terminal and record.result is not None:
            if record.state.value == "conflict":
                return answer(OperationConflict(operation_id=op))
            ours = record.fencing_token == attempt.fencing_token
            return result_response(record.result, op, replayed=not ours)
        await self._give_up(operation_id, attempt)  # ignored if another attempt took over
        return fresh(
            problem_response(
                "lease-unavailable",
                "this attempt lost its lease before its outcome committed; retry",
                headers={"Retry-After": "1"},
                operation_id=op,
            ),
            op,
        )

    async def _give_up(self, operation_id: uuid.UUID, attempt: AttemptRef) -> None:
        """A bug is not an outcome: the attempt reports ``unknown`` so a retry may run again."""
        with contextlib.suppress(Exception):
            await self._rt.store.settle(
                operation_id,
                Observation(
                    tuple=attempt.reservation,
                    kind=ObservationKind.UNKNOWN,
                    source=Source.ATTEMPT,
                    fencing_token=attempt.fencing_token,
                ),
                attempt_id=attempt.attempt_id,
            )

    def _settled_response(self, settled: Settled, operation_id: str) -> Response[bytes]:
        record = settled.record
        ours = settled.decision.disposition.value == "applied" and record.state.terminal
        if record.result is not None and record.state.terminal and record.state.value != "conflict":
            return result_response(record.result, operation_id, replayed=not ours)
        if record.state.value == "conflict":
            return answer(OperationConflict(operation_id=operation_id))
        return answer(
            InProgress(operation_id=operation_id, lease_expires_at=record.lease_expires_at or 0)
        )

    # -- in progress: 409 or Prefer: wait ------------------------------------------------------

    async def _in_progress(
        self,
        request: Request[Any, Any, Any],
        scope: Scope,
        claim: ClaimRequest,
        record: Record | None,
    ) -> Response[bytes]:
        store = self._rt.store
        if record is None:
            record = await store.get_by_scope(scope)
        if record is None:
            return busy(scope)  # the winner has not inserted its row yet
        operation_id = record.tuple.operation_id
        wait = prefer_wait(request.headers.get("prefer"), self._rt.settings.max_wait)
        if wait > 0:
            async with self._rt.waiter.wait_for(operation_id) as settled:
                current = await store.get_by_scope(scope)
                if current is not None and not current.state.terminal:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(settled, wait)
                    current = await store.get_by_scope(scope)
            if current is not None and current.state.terminal:
                response = answer(decide_claim(current, claim, time.time()))
                response.headers["Preference-Applied"] = f"wait={wait:g}"
                return response
        lease_left = record.lease_expires_at or 0.0
        return answer(InProgress(operation_id=operation_id, lease_expires_at=lease_left))

    # -- decisions to HTTP -----------------------------------------------------------------


def _attempt_of(
    claimed: ClaimOutcome, principal: Principal
) -> tuple[uuid.UUID, AttemptRef, ExecutionContext]:
    """What a freshly claimed attempt knows about itself."""
    record = claimed.record
    assert record is not None and claimed.attempt_id is not None
    operation_id = uuid.UUID(record.tuple.operation_id)
    attempt = AttemptRef(
        attempt_id=claimed.attempt_id,
        reservation=record.tuple,
        fencing_token=record.fencing_token,
    )
    context = ExecutionContext(
        principal=principal,
        operation_id=operation_id,
        binding_generation=record.tuple.binding_generation,
    )
    return operation_id, attempt, context


async def _bounded(call: Awaitable[SignedEvidence], limit: float) -> SignedEvidence:
    """Bound an external call in total time; past it there is no answer to wait for."""
    try:
        async with asyncio.timeout(limit):
            return await call
    except TimeoutError as exc:
        raise ProviderUnavailable(f"no answer within {limit:g}s") from exc
