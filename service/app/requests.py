"""The idempotent request (docs/design.md §5 steps 2-7), with no HTTP and no SQL.

Given an authenticated principal, a parsed key and a validated body:

2. one indexed read of the scope's row; the core decides: replay a terminal match, refuse a
   mismatch or a conflict (no lease is taken for any of these);
3. take the scope's Redis lease (held by a live attempt: 409, or ``Prefer: wait``);
4. claim in PostgreSQL with one CAS, which creates the attempt row and its fencing token;
5-6. run the attempt under a heartbeat and settle it (:mod:`service.app.attempts`);
7. release the lease (with the settlement's wake-up, one round trip).

A new operation of a local route with a statement form does 4-6 in one statement, with no
lease (3 and 7): the row is written once, already settled, or not at all.

Everything returned is an :data:`~service.app.answers.Answer` for HTTP to render.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import msgspec

from service.app.answers import Answer, Problem, answer_of, busy, expired, with_preference
from service.app.attempts import Attempts
from service.app.effects import IdempotentRoute
from service.app.fingerprint import canonical_request, fingerprint_of
from service.app.ports import LeasePort, SettlementPort, TombstonePort, WakeupPort
from service.core import (
    Binding,
    Claim,
    ClaimRequest,
    InProgress,
    OperationState,
    Record,
    Scope,
    decide_claim,
)
from service.domain.principals import Principal
from service.failpoints import Failpoints
from service.leases import Lease, LeaseUnavailable
from service.store.outcomes import KeyExpired
from service.store.principals import hash_key
from service.store.retention import Tombstone
from service.store.settlement import RowLocked, SettlementContention
from service.telemetry import annotate, span

__all__ = ["IdempotentRequests", "NoSlot", "Prepared", "Seen", "Slots"]


class NoSlot(Exception):
    """No slot of this principal came free in time."""


class Slots:
    """Per key (a principal), at most ``size`` holders at once in this process; a holder
    waits up to ``wait`` seconds for a slot. Idle keys are forgotten."""

    def __init__(self, size: int, wait: float) -> None:
        self._size = size
        self._wait = wait
        self._held: dict[uuid.UUID, tuple[asyncio.Semaphore, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: uuid.UUID) -> AsyncIterator[bool]:
        """A slot of ``key``'s; yields whether it had to wait for one."""
        semaphore, users = self._held.get(key, (asyncio.Semaphore(self._size), 0))
        self._held[key] = (semaphore, users + 1)
        try:
            waited = semaphore.locked()
            if waited:  # wait (a task) only when no slot is free
                try:
                    async with asyncio.timeout(self._wait):  # no task, unlike wait_for
                        await semaphore.acquire()
                except TimeoutError:
                    raise NoSlot(str(key)) from None
            else:
                await semaphore.acquire()
            try:
                yield waited
            finally:
                semaphore.release()
        finally:
            semaphore, users = self._held[key]
            if users == 1:
                del self._held[key]
            else:
                self._held[key] = (semaphore, users - 1)


class Seen(msgspec.Struct, frozen=True):
    """What the request's first read found: its Idempotency-Key and that scope's row."""

    key: str
    record: Record | None
    tombstone: Tombstone | None = None
    """the scope's tombstone, if its earlier operation was purged by retention and it still
    stands"""


class Prepared(NamedTuple):
    """A request read and checked, as :meth:`IdempotentRequests.prepare` makes it."""

    spec: IdempotentRoute
    principal: Principal
    seen: Seen
    body: Any
    scope: Scope
    claim: ClaimRequest
    wait: float


class IdempotentRequests:
    def __init__(
        self,
        *,
        store: SettlementPort,
        tombstones: TombstonePort,
        leases: LeasePort,
        wakeups: WakeupPort,
        attempts: Attempts,
        failpoints: Failpoints,
        clock: Callable[[], float],
        per_principal: int,
        slot_wait: float,
    ) -> None:
        """``per_principal``: idempotent requests one principal may have running at once in
        this process; more wait up to ``slot_wait`` seconds for a slot, then get 429. So one
        client cannot take every connection of the pool from the others."""
        self._store = store
        self._tombstones = tombstones
        self._leases = leases
        self._wakeups = wakeups
        self._attempts = attempts
        self._failpoints = failpoints
        self._clock = clock
        self._slots = Slots(per_principal, slot_wait)
        # ``claim.after`` and ``effect.before_commit`` stand between a claim and its commit,
        # which only the locked path has: with one of them armed, new local operations are
        # claimed first, then settled under the row's lock. Every other failpoint leaves new
        # operations on the one statement (``effect.before_statement`` and
        # ``effect.after_commit`` stand right before and right after it)
        self._holds_attempts = any(
            failpoints.armed(name) for name in ("claim.after", "effect.before_commit")
        )

    async def identify(
        self, api_key: str, spec: IdempotentRoute, key: str
    ) -> tuple[Principal, Seen] | None:
        """Who holds ``api_key`` and what their scope (``spec``'s route, ``key``) holds, in
        one statement (a replay needs no other), one more on the key's first request in this
        process (its tenant, remembered after); None for an unknown or revoked key."""
        found = await self._store.reads.identify(hash_key(api_key), spec.route, key)
        if found is None:
            return None
        principal, record, tombstone = found
        return principal, Seen(key=key, record=record, tombstone=tombstone)

    def prepare(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        seen: Seen,
        body: msgspec.Struct,
        *,
        path_params: dict[str, Any] | None = None,
        wait: float = 0.0,
    ) -> Prepared:
        """The request as the use case reads it: its scope and its claim (the fingerprint of
        the route, path parameters and body). ``seen``: what :meth:`identify` read for this
        principal and key; ``wait``: seconds to wait for an attempt in progress to settle
        (``Prefer: wait``)."""
        scope = Scope(
            tenant=principal.tenant,
            principal_id=principal.id,
            route=spec.route,
            idempotency_key=seen.key,
        )
        canonical = canonical_request(spec.route, path_params or {}, body)
        claim = ClaimRequest(
            request_fingerprint=fingerprint_of(canonical),
            canonical_request=canonical.decode(),
            binding=Binding(str(principal.id), principal.credential_generation),
            new_operation_id=str(uuid.uuid4()),
            lease_expires_at=self._clock() + self._leases.ttl,
        )
        return Prepared(spec, principal, seen, body, scope, claim, wait)

    async def first_answer(self, request: Prepared) -> Answer | None:
        """What the scope's first read answers with no effect and no lease: the key's
        tombstone (410), a replay, a fingerprint or binding mismatch, a conflict, an attempt
        in progress (``Prefer: wait`` included). None: :meth:`execute` may run the effect."""
        record, tombstone = request.seen.record, request.seen.tombstone
        if record is None and tombstone is not None:
            return expired(tombstone)  # whatever the body: nothing runs under this key yet
        if record is None:
            return None
        return await self._decided(request.scope, request.claim, record, request.wait)

    async def handle(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        seen: Seen,
        body: msgspec.Struct,
        *,
        path_params: dict[str, Any] | None = None,
        wait: float = 0.0,
    ) -> Answer:
        """Execute the request once, or answer what its earlier execution settled: the first
        answer, else the execution."""
        request = self.prepare(spec, principal, seen, body, path_params=path_params, wait=wait)
        first = await self.first_answer(request)
        return first if first is not None else await self.execute(request)

    async def execute(self, request: Prepared) -> Answer:
        """Execute a request :meth:`first_answer` left to run (it decides again on what it
        reads, under the lease where it takes one)."""
        spec, scope = request.spec, request.scope
        try:
            return await self._run(
                spec,
                request.principal,
                scope,
                request.claim,
                request.body,
                request.wait,
                request.seen.record,
            )
        except KeyExpired as exc:  # purged between this request's first read and its claim
            tombstone = await self._tombstones.by_operation(exc.operation_id)
            if tombstone is not None:
                return expired(tombstone)
            return Problem(  # forgotten as well since (a tombstone retention of seconds)
                "idempotency-key-expired",
                "this operation's result expired and was purged",
                str(exc.operation_id),
            )
        except RowLocked:
            return busy(scope)
        except SettlementContention as exc:
            return Problem("service-unavailable", str(exc), retry_after=True)
        except NoSlot:
            return Problem(
                "too-many-requests",
                "this principal's requests have used all their slots in this process for "
                "too long; retry shortly",
                retry_after=True,
            )

    async def _run(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        scope: Scope,
        claim: ClaimRequest,
        body: Any,
        wait: float,
        record: Record | None,
    ) -> Answer:
        if record is None and spec.statement is not None and not self._holds_attempts:
            # a new local operation: claimed, run and settled in one statement, with no lease
            answered = await self._in_one_statement(spec, principal, scope, claim, body)
            if answered is not None:
                return answered
            # nothing was written: a duplicate's statement committed the scope's row first
            # (this one waited for it on the scope's unique index), or a lock was not
            # granted. A settled row answers with no lease; anything else takes the lease
            record = await self._store.reads.get_by_scope(scope)
            if record is not None:
                decided = await self._decided(scope, claim, record, wait)
                if decided is not None:
                    return decided
        # (a row of the first read was decided by first_answer: it may be claimed)
        try:
            with span("settlement.lease", operation_route=spec.route) as traced:
                lease = await self._leases.acquire(scope.lease_name())
                traced.set(lease_acquired=lease is not None)
        except LeaseUnavailable:
            return _no_lease(record)
        if lease is None:
            return await self._in_progress(scope, claim, record, wait)
        held: list[Lease] = [lease]  # the lease as last renewed; emptied once released

        async def release(announce: str | None = None) -> None:
            if held:
                with contextlib.suppress(LeaseUnavailable):
                    await self._leases.release(held.pop(), announce=announce)

        try:
            # only an executing attempt takes one of the principal's slots: a replay or a 409
            # never waits for one
            async with self._slots.hold(principal.id) as waited:
                if waited and lease.expires_at - self._leases.now() < lease.ttl / 2:
                    # the lease ran down while this request queued, before any heartbeat:
                    # renew it so the claim starts with a whole ttl (a wait shorter than
                    # half a ttl leaves plenty; the heartbeat renews from there). Expired
                    # meanwhile: take it anew, unless a duplicate holds it now (409)
                    try:
                        renewed = await self._leases.extend(lease)
                        if renewed is None:
                            renewed = await self._leases.acquire(scope.lease_name())
                    except LeaseUnavailable:
                        return _no_lease(record)
                    if renewed is None:
                        held.clear()  # another's now: nothing of ours to release
                        return busy(scope)
                    held[0] = lease = renewed
                return await self._execute(
                    spec, principal, scope, claim, body, record, lease, release
                )
        finally:
            await release()

    async def _execute(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        scope: Scope,
        claim: ClaimRequest,
        body: Any,
        record: Record | None,
        lease: Lease,
        release: Callable[[str | None], Awaitable[None]],
    ) -> Answer:
        """Claim, run the attempt, release the lease (``release``): the settlement's wake-up
        for ``Prefer: wait`` requests goes with the release, in one round trip to Redis."""
        with span("settlement.claim", operation_route=spec.route) as traced:
            claimed = await self._store.claim(
                scope,
                claim,
                lease_token=lease.token,
                holds_lease=True,
                assume_absent=record is None,
            )
            if not isinstance(claimed.decision, Claim):
                return answer_of(claimed.decision)
            assert claimed.record is not None
            operation_id = claimed.record.reservation.operation_id
            attempt = claimed.record.fencing_token
            traced.set(
                operation_id=operation_id,
                attempt_number=attempt,
                claim_kind=claimed.decision.kind.value,
            )
        annotate(operation_id=operation_id, attempt=attempt)
        with self._wakeups.deferred(operation_id) as announced:
            await self._failpoints.hit("claim.after")
            answer = await self._attempts.run(spec, principal, body, claimed, lease)
            await release(announced())
        return answer

    async def _decided(
        self, scope: Scope, claim: ClaimRequest, record: Record, wait: float
    ) -> Answer | None:
        """The answer the scope's row gives without a lease: a replay, a refusal, or another
        attempt in progress; None when this request may claim it (under the lease)."""
        match decide_claim(record, claim, self._clock()):
            case Claim():
                return None  # take the lease, then decide again under the row lock
            case InProgress():
                # the claim-time lease has not run out: its attempt holds the lease (or died
                # holding it), so the answer needs no round trip to Redis
                return await self._in_progress(scope, claim, record, wait)
            case answered:
                return answer_of(answered)

    async def _in_one_statement(
        self,
        spec: IdempotentRoute,
        principal: Principal,
        scope: Scope,
        claim: ClaimRequest,
        body: Any,
    ) -> Answer | None:
        """A new local operation, claimed, run and settled in one statement, with no lease
        (docs/design.md §3 rule 2): nothing ``in_progress`` is ever committed, so no other
        attempt can find it unsettled, and a duplicate's statement waits on the scope's
        unique index for this one's commit, then writes nothing and replays the settled row.
        None when nothing was written. Its settlement is announced to nobody: no request
        can wait on a row it never saw unsettled."""
        async with self._slots.hold(principal.id):
            with self._wakeups.deferred(claim.new_operation_id) as announced:
                answered = await self._attempts.run_new_local(
                    spec, principal, scope, claim, body, lease_token=None
                )
                announced()  # taken, so not published
        return answered

    async def _in_progress(
        self, scope: Scope, claim: ClaimRequest, record: Record | None, wait: float
    ) -> Answer:
        """Another attempt holds the lease: 409, or wait for its settlement and replay.

        With no row in this request's first read and no wait, the 409 points at the key's
        lookup (which finds the operation once its row exists) without reading the scope
        again: a new local operation's row appears only settled, so under contention that
        read found nothing but cost a round trip per duplicate."""
        if record is None:
            if wait <= 0:
                return busy(scope)
            record = await self._store.reads.get_by_scope(scope)
        if record is None:
            return busy(scope)  # the winner has not inserted its row yet
        operation_id = record.reservation.operation_id
        if wait > 0:
            current = None
            async with self._wakeups.wait_for(operation_id) as settled:
                if settled is not None:  # subscribed: re-read, then wait for the wake-up
                    current = await self._store.reads.get_by_scope(scope)
                    if current is not None and not current.state.terminal:
                        await settled(wait)
                        current = await self._store.reads.get_by_scope(scope)
            if current is not None and current.state.terminal:
                decided = answer_of(decide_claim(current, claim, self._clock()))
                return with_preference(decided, f"wait={wait:g}")
            if current is not None and current.state is OperationState.UNKNOWN:
                # the attempt ended without an outcome while we waited: say so, at once
                return Problem(
                    "operation-in-progress",
                    "the attempt ended without an outcome; retry with the same key to run it",
                    operation_id,
                    state=current.state.value,
                    retry_after=True,
                    location=f"/v1/operations/{operation_id}",
                )
        return answer_of(
            InProgress(operation_id=operation_id, lease_expires_at=record.lease_expires_at or 0.0)
        )


def _no_lease(record: Record | None) -> Problem:
    return Problem(
        "lease-unavailable",
        "the lease store is unreachable; no new execution without a lease",
        None if record is None else record.reservation.operation_id,
        retry_after=True,
    )
