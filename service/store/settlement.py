"""The settlement store: the one write path for authoritative operation state.

Every write is an atomic phase: lock the row (``get_for_update``), ask the pure core, write
with a CAS on reservation tuple + revision, and record the observation (with the stage and
disposition that decided it) in the same transaction. A refused CAS reruns the whole phase on
a fresh read; it never assigns blindly. Claim, settle, supersede and sweep are thin callers of
the one :class:`PhaseRunner`; a new claim and a local effect's settlement take the hot path
(:mod:`service.store.hot`), which keeps the same lock and CAS: a scope with no row is
claimed and settled in one statement, anything else under the row's lock.

The store holds two parts, each an object of its own that callers reach by name: its
``reads`` (:class:`~service.store.settlement_reads.SettlementReads`: single statements, no
lock, the request's first read among them) and its ``reports``
(:class:`~service.store.settlement_reports.SettlementReports`: what a commit tells the hooks
and the log). The hot path is shared: the reads and the writes take the same
:class:`HotPath`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from sqlalchemy import ColumnElement
from sqlalchemy.ext.asyncio import AsyncEngine

from service.core import (
    Claim,
    ClaimRequest,
    Observation,
    Record,
    Refuse,
    Scope,
    SupersedeDecision,
    SupersedeRequest,
    TerminalPolicy,
    decide_claim,
)
from service.store.claims import claim_phase
from service.store.epochs import by_tenant, expired_leases, supersede_phase, sweep_phase
from service.store.hot import HotPath
from service.store.merge import settle_phase
from service.store.outcomes import (
    AttemptRef,
    ClaimOutcome,
    EffectRefused,
    EffectSql,
    EffectStatement,
    LeaseProbe,
    NoHooks,
    OperationNotFound,
    Settled,
    SettlementHooks,
    SweepCursor,
    SweepPage,
)
from service.store.phase import Phase, PhaseRunner, RowLocked, SettlementContention
from service.store.principals import KEY_TENANTS, KeyTenants
from service.store.retention import Retention
from service.store.rows import at
from service.store.settlement_reads import SettlementReads
from service.store.settlement_reports import SettlementReports
from service.store.unit_of_work import UnitOfWork, observer_tenant

__all__ = [
    "AttemptRef",
    "ClaimOutcome",
    "EffectRefused",
    "EffectStatement",
    "LeaseProbe",
    "OperationNotFound",
    "RowLocked",
    "Settled",
    "SettlementContention",
    "SettlementHooks",
    "SettlementStore",
    "SweepCursor",
    "SweepPage",
]


class SettlementStore:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        hooks: SettlementHooks | None = None,
        policy: TerminalPolicy = TerminalPolicy.CONFLICT,
        retention: Retention | None = None,
        max_retries: int = 16,
        clock: Callable[[], float] = time.time,
        pool: Any = None,
        key_tenants: int = KEY_TENANTS,
        functions: bool = False,
    ) -> None:
        """``pool``: the hot path's :class:`service.store.pool.HotPool`; local
        effects need it, and with it a new operation is claimed in one statement.
        ``key_tenants``: how many API keys' tenants the hot path remembers. ``functions``:
        that statement is sent as a call of its effect's function
        (:mod:`service.store.hot_functions`; :meth:`install_functions` first)."""
        self._engine = engine
        self._hot = (
            None if pool is None else HotPath(pool, KeyTenants(key_tenants), functions=functions)
        )
        self._policy = policy
        self._retention = retention or Retention(default=86_400.0, tombstone=2_592_000.0)
        self._clock = clock
        self._runner = PhaseRunner(self.unit_of_work, max_retries=max_retries)
        self.reads = SettlementReads(engine, hot=self._hot, clock=clock)
        """the operations' rows read (single statements, no lock)"""
        self.reports = SettlementReports(hooks or NoHooks())
        """what a commit tells the hooks and the log"""

    async def install_functions(self, effects: Iterable[EffectSql]) -> list[str]:
        """With ``functions``, create the claim-and-settle functions of ``effects`` the
        database lacks (:func:`service.store.hot_functions.install`); the names created."""
        if self._hot is None:
            return []
        return await self._hot.install_functions(effects)

    def unit_of_work(self) -> UnitOfWork:
        return UnitOfWork(self._engine)

    # -- observations that never reach a row ---------------------------------------------------

    async def record_refused(
        self,
        operation_id: uuid.UUID | None,
        observation: Observation,
        reason: str,
        detail: dict[str, Any] | None = None,
        attempt_id: uuid.UUID | None = None,
        *,
        tenant: str | ColumnElement[str],
    ) -> None:
        """Keep an observation that never reached a row (quarantined, stage A); without an
        ``operation_id``, it is listed under no operation. ``tenant``: the operation's, or
        about an operation that is not here the observer's (``observer_tenant``)."""
        async with self.unit_of_work() as uow:
            await uow.record_observation(
                operation_id,
                observation,
                stage="A",
                disposition="quarantined",
                reason=reason,
                revision_before=None,
                revision_after=None,
                attempt_id=attempt_id,
                detail=detail,
                tenant=tenant,
            )
            await uow.commit()
        self.reports.refused(observation)

    # -- settle: one observation into the row -------------------------------------------------

    async def settle(
        self,
        operation_id: uuid.UUID,
        observation: Observation,
        *,
        attempt_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
        tenant: str | None = None,
    ) -> Settled:
        """Merge one observation into the row, under its lock, with the tuple + revision CAS.
        An observation about no operation is recorded as quarantined, then refused.
        ``tenant``: the operation's, when the caller knows it (else found from its id)."""
        started = time.perf_counter()
        phase = settle_phase(
            operation_id,
            observation,
            tenant=tenant,
            attempt_id=attempt_id,
            detail=detail,
            clock=self._clock,
            policy=self._policy,
            retention=self._retention,
        )
        found = await self._runner.run(f"settle {operation_id}", phase)
        if found is None:  # gone: kept under the tenant the caller knew it by, else the
            # observer's (an operation that is not here)
            await self.record_refused(
                operation_id, observation, "unknown-operation", detail, attempt_id,
                tenant=observer_tenant(detail) if tenant is None else tenant,
            )  # fmt: skip
            raise OperationNotFound(str(operation_id))
        before, settled = found
        self.reports.settled(operation_id, before, settled, time.perf_counter() - started)
        return settled

    async def settle_local(
        self,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        statement: EffectStatement,
        *,
        tenant: str,
        route: str,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> Settled:
        """Run a local effect (``statement``, its SQL) and settle its outcome in one
        transaction under the row's lock (:meth:`HotPath.settle_locked`). ``tenant`` and
        ``route``: the operation's (its retention starts if the row becomes terminal).

        The effect runs only while ``attempt`` holds the current fencing token of a
        non-terminal row, and commits only if the core applies its outcome. A fenced-out or
        late attempt settles a probe (``unknown`` with its token) instead, which the core
        ignores: the stale worker's effect never commits. ``EffectRefused`` when a constraint
        refused the effect's writes (nothing was written).
        """
        if self._hot is None:
            raise RuntimeError("local effects need the store's HotPool")
        started = time.perf_counter()
        done = await self._hot.settle_locked(
            tenant,
            operation_id,
            attempt,
            statement,
            clock=self._clock,
            policy=self._policy,
            retention=self._retention.of(route),
            before_commit=before_commit,
        )
        if done is None:
            raise OperationNotFound(str(operation_id))
        before, settled = done
        self.reports.settled(operation_id, before, settled, time.perf_counter() - started)
        return settled

    @property
    def runner(self) -> PhaseRunner:
        """The phase runner (one retry policy) for phases that settle with more beside."""
        return self._runner

    def settle_phase_of(
        self, operation_id: uuid.UUID, observation: Observation, detail: dict[str, Any]
    ) -> Phase[tuple[Record, Settled] | None]:
        """The settle phase of :meth:`settle`, for a caller that commits more in the same
        transaction (a feed event's receipt); report its result with ``reports.settled``."""
        return settle_phase(
            operation_id,
            observation,
            attempt_id=None,
            detail=detail,
            clock=self._clock,
            policy=self._policy,
            retention=self._retention,
        )

    # -- claim: a new attempt -----------------------------------------------------------------

    async def claim(
        self,
        scope: Scope,
        request: ClaimRequest,
        *,
        lease_token: str | None = None,
        holds_lease: bool = False,
        assume_absent: bool = False,
    ) -> ClaimOutcome:
        """Claim the scope's operation for a new attempt, or say why not (one CAS).

        ``holds_lease``: the caller holds the scope's lease, so the row's own attempt cannot
        (a row still in_progress is stale). ``assume_absent``: the caller just read no row
        for the scope; the new row and its attempt are inserted in one statement without a
        locked read (if another claimer inserted meanwhile, nothing is written and the
        locked claim runs instead).
        """
        if assume_absent and self._hot is not None:
            now = self._clock()
            decision = decide_claim(None, request, now)
            assert isinstance(decision, Claim)  # no row: always a NEW claim
            attempt_id = uuid.uuid4()
            if await self._hot.claim_new(
                scope, decision.record, attempt_id, lease_token, at(now), request.canonical_request
            ):
                return self.reports.claimed(
                    ClaimOutcome(decision=decision, record=decision.record, attempt_id=attempt_id)
                )
        phase = claim_phase(
            scope,
            request,
            lease_token=lease_token,
            holds_lease=holds_lease,
            clock=self._clock,
            policy=self._policy,
        )
        return self.reports.claimed(await self._runner.run(f"claim {scope.route}", phase))

    async def claim_and_settle_local(
        self,
        scope: Scope,
        request: ClaimRequest,
        build: Callable[[ClaimOutcome], EffectStatement],
        *,
        lease_token: str | None,
        route: str,
    ) -> tuple[ClaimOutcome, Settled] | None:
        """For a scope with no row (the caller just read none; it holds no lease):
        claim, run the local effect ``build`` gives for the claim, and settle its outcome, in
        one statement (:meth:`HotPath.claim_and_settle`). None when nothing was written: then
        :meth:`claim` and :meth:`settle_local` do it under the row's lock. ``EffectRefused``
        when a constraint refused the effect's writes (nothing was written)."""
        if self._hot is None:
            return None
        started = time.perf_counter()
        now = self._clock()
        decision = decide_claim(None, request, now)
        assert isinstance(decision, Claim)  # no row: always a NEW claim
        outcome = ClaimOutcome(decision=decision, record=decision.record, attempt_id=uuid.uuid4())
        assert outcome.attempt_id is not None
        settled = await self._hot.claim_and_settle(
            scope,
            decision.record,
            outcome.attempt_id,
            lease_token,
            build(outcome),
            now=now,
            policy=self._policy,
            retention=self._retention.of(route),
            canonical_request=request.canonical_request,
        )
        if settled is None:
            return None
        self.reports.claimed(outcome)
        operation_id = uuid.UUID(decision.record.reservation.operation_id)
        self.reports.settled(operation_id, decision.record, settled, time.perf_counter() - started)
        return outcome, settled

    # -- supersede: a new reservation epoch ---------------------------------------------------

    async def supersede(
        self,
        operation_id: uuid.UUID,
        *,
        reason: str,
        admin_id: uuid.UUID,
        request_fingerprint: str | None,
        rebind: bool,
        force: bool,
        external: bool = False,
        lease_remaining: LeaseProbe,
        canonical_request: str | None = None,
        tenant: str | None = None,
    ) -> SupersedeDecision:
        """Start a new reservation epoch in one transaction under the row lock, with the CAS;
        the closed epoch is archived in ``operation_epochs`` (tuple, final state, digest,
        reason, who, when). ``canonical_request``: what an edited ``request_fingerprint``
        covers, written with it. ``tenant``: the operation's, when the caller knows it."""

        phase = supersede_phase(
            operation_id,
            SupersedeRequest(
                request_fingerprint=request_fingerprint, force=force, external=external
            ),
            rebind=rebind,
            reason=reason,
            admin_id=admin_id,
            clock=self._clock,
            lease_remaining=lease_remaining,
            canonical_request=canonical_request,
            tenant=tenant,
        )
        decision = await self._runner.run(f"supersede {operation_id}", phase)
        if not isinstance(decision, Refuse):
            self.reports.superseded(operation_id, decision, reason)
        return decision

    # -- sweep: dead attempts become unknown --------------------------------------------------

    async def sweep(
        self, batch: int, lease_remaining: LeaseProbe, after: SweepCursor | None = None
    ) -> SweepPage:
        """Demote up to ``batch`` in_progress rows whose lease has expired to ``unknown``.

        The rows are found across tenants in one read without a lock (a page in
        (lease_expires_at, id) order after ``after``, so rows that are still live never hide
        the dead ones behind them), then locked tenant by tenant, each tenant's rows in a
        transaction of its own (one shard on Citus), ``FOR UPDATE SKIP LOCKED`` so several
        sweepers share the work. ``lease_remaining`` asks the lease store, in one round
        trip, what each scope's lease has left (a heartbeat keeps Redis, not this row, up to
        date): the core leaves live ones alone. Each demotion goes through the core and the
        CAS and is recorded (source sweeper); a row whose CAS is refused is skipped, not the
        batch.
        """

        async with self._engine.connect() as conn:
            found = await expired_leases(conn, at(self._clock()), batch, after)
        demoted: list[uuid.UUID] = []
        for tenant, ids in by_tenant(found).items():
            phase = sweep_phase(
                tenant, ids, lease_remaining, clock=self._clock, policy=self._policy
            )
            demoted += await self._runner.run(f"sweep {tenant}", phase)
        page = SweepPage(demoted=demoted, next=found[-1][2] if len(found) == batch else None)
        self.reports.swept(len(page.demoted))
        return page
