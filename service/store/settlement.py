"""The settlement store: the one write path for authoritative operation state.

Every write locks the row (``get_for_update``), asks the pure core, and writes with a CAS
on reservation tuple + revision, recording the observation (with the stage and disposition
that decided it) in the same transaction. If the CAS is refused it reloads and reruns all
three stages; it never assigns blindly.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import Any, Protocol

import msgspec
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.core import (
    Apply,
    Binding,
    Claim,
    ClaimDecision,
    ClaimKind,
    ClaimRequest,
    Decision,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    Refuse,
    ReservationTuple,
    Source,
    SupersedeDecision,
    SupersedeRequest,
    TerminalPolicy,
    decide_claim,
    decide_supersede,
    settle,
)
from service.store.db import reader
from service.store.rows import Scope, at, record_from_row
from service.store.tables import operations
from service.store.unit_of_work import AttemptEnd, StaleRevision, UnitOfWork, scope_predicate

__all__ = [
    "AttemptRef",
    "ClaimOutcome",
    "LocalEffect",
    "OperationNotFound",
    "RowLocked",
    "Settled",
    "SettlementContention",
    "SettlementHooks",
    "SettlementStore",
    "SweepCursor",
    "SweepPage",
]

log = logging.getLogger("settlement.store")

# SQLSTATE of "lock_timeout expired" (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"

# A local effect writes its rows on the settlement transaction's connection and reports its
# outcome (completed or failed, with the result) as an observation of the current attempt.
LocalEffect = Callable[[AsyncConnection, Record], Awaitable[Observation]]


class OperationNotFound(LookupError):
    status_hint = 404


class RowLocked(RuntimeError):
    """The operation row stayed locked past the lock timeout (another phase holds it)."""

    status_hint = 409


class SettlementContention(RuntimeError):
    """The revision kept moving for ``settle_max_retries`` rounds."""

    status_hint = 503


class Settled(msgspec.Struct, frozen=True):
    """The decision, the authoritative record after it, and the observation that was settled."""

    decision: Decision
    record: Record
    observation: Observation
    observation_id: int


SweepCursor = tuple[datetime, uuid.UUID]


class SweepPage(msgspec.Struct, frozen=True):
    """What one sweep demoted, and where the next page starts (None: start over)."""

    demoted: list[uuid.UUID]
    next: SweepCursor | None


class AttemptRef(msgspec.Struct, frozen=True):
    """What an attempt knows about itself: its row, its reservation and its fencing token."""

    attempt_id: uuid.UUID
    reservation: ReservationTuple
    fencing_token: int


class ClaimOutcome(msgspec.Struct, frozen=True):
    decision: ClaimDecision
    record: Record | None
    attempt_id: uuid.UUID | None = None


class SettlementHooks(Protocol):
    """What the store reports as it settles (metrics live behind this)."""

    def on_settled(self, source: str, disposition: str) -> None: ...

    def on_claimed(self, kind: str) -> None: ...

    def on_stale_epoch_outcome(self) -> None: ...


class _NoHooks:
    def on_stale_epoch_outcome(self) -> None:
        return None

    def on_settled(self, source: str, disposition: str) -> None:
        return None

    def on_claimed(self, kind: str) -> None:
        return None


class SettlementStore:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        hooks: SettlementHooks | None = None,
        policy: TerminalPolicy = TerminalPolicy.CONFLICT,
        retention: float = 86_400.0,
        max_retries: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._reader = reader(engine)
        self._policy = policy
        self._retention = retention
        self._max_retries = max_retries
        self._clock = clock
        self._hooks: SettlementHooks = hooks or _NoHooks()

    def unit_of_work(self) -> UnitOfWork:
        return UnitOfWork(self._engine)

    @staticmethod
    @contextlib.contextmanager
    def _lock_timeouts() -> Iterator[None]:
        """A lock not granted within the lock timeout is a busy row, not a server fault."""
        try:
            yield
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                raise RowLocked("the operation row is locked by another phase") from exc
            raise

    # -- reads --------------------------------------------------------------------------------

    async def get(self, operation_id: uuid.UUID) -> Record | None:
        async with self._reader.connect() as conn:
            row = (
                (await conn.execute(select(operations).where(operations.c.id == operation_id)))
                .mappings()
                .first()
            )
        return None if row is None else record_from_row(row)

    async def owner_of(self, operation_id: uuid.UUID) -> tuple[str, str] | None:
        """(tenant, route) of an operation, or None."""
        async with self._reader.connect() as conn:
            row = (
                await conn.execute(
                    select(operations.c.tenant, operations.c.route).where(
                        operations.c.id == operation_id
                    )
                )
            ).first()
        return None if row is None else (row.tenant, row.route)

    async def record_refused(
        self,
        operation_id: uuid.UUID,
        observation: Observation,
        reason: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Keep an observation that never reached a row (quarantined, stage A)."""
        async with self.unit_of_work() as uow:
            await uow.record_observation(
                operation_id,
                observation,
                stage="A",
                disposition="quarantined",
                reason=reason,
                revision_before=None,
                revision_after=None,
                detail=detail,
            )
            await uow.commit()
        self._hooks.on_settled(observation.source.value, "quarantined")

    async def sweep(
        self,
        batch: int,
        live: Callable[[list[Scope]], Awaitable[list[bool]]],
        after: SweepCursor | None = None,
    ) -> SweepPage:
        """Demote up to ``batch`` in_progress rows whose lease has expired to ``unknown``.

        Rows are taken with ``FOR UPDATE SKIP LOCKED`` so several sweepers share the work,
        in (lease_expires_at, id) order after ``after``, so rows that are still live never
        hide the dead ones behind them. ``live`` asks the lease store, in one round trip,
        which scopes an attempt still holds (a heartbeat keeps Redis, not this row, up to
        date); those are left alone. Each demotion goes through the core and the CAS and is
        recorded (source sweeper).
        """
        now = self._clock()
        demoted: list[uuid.UUID] = []
        with self._lock_timeouts():
            async with self.unit_of_work() as uow:
                rows = await uow.expired_in_progress(at(now), batch, after)
                alive = await live([scope for scope, _, _ in rows])
                for (_, record, _), is_live in zip(rows, alive, strict=True):
                    if is_live:
                        continue
                    operation_id = uuid.UUID(record.tuple.operation_id)
                    observation = Observation(
                        tuple=record.tuple, kind=ObservationKind.UNKNOWN, source=Source.SWEEPER
                    )
                    decision = settle(record, observation, now, self._policy)
                    if isinstance(decision, Apply):
                        await uow.cas_write(decision.record, decision.expected_revision, at(now))
                        demoted.append(operation_id)
                    await uow.record_decision(operation_id, observation, decision, record.revision)
                await uow.commit()
        for _ in demoted:
            self._hooks.on_settled(Source.SWEEPER.value, "applied")
        last = rows[-1][2] if len(rows) == batch else None
        return SweepPage(demoted=demoted, next=last)

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
        is_live: Callable[[Scope], Awaitable[bool]],
    ) -> SupersedeDecision:
        """Start a new reservation epoch in one transaction under the row lock, with the CAS;
        the closed epoch is archived in ``operation_epochs`` (tuple, final state, digest,
        reason, who, when). ``is_live`` tells whether an attempt still holds the lease."""
        with self._lock_timeouts():
            for _ in range(self._max_retries):
                async with self.unit_of_work() as uow:
                    found = await uow.get_for_update_with_scope(operation_id)
                    if found is None:
                        raise OperationNotFound(str(operation_id))
                    scope, record = found
                    now = self._clock()
                    if record.state is OperationState.IN_PROGRESS:
                        # the lease lives in Redis; the row's column is only the claim-time view
                        live = await is_live(scope)
                        record = msgspec.structs.replace(
                            record, lease_expires_at=now + 1.0 if live else None
                        )
                    binding = None
                    if rebind:
                        generation = await uow.credential_generation(scope.principal_id)
                        binding = Binding(str(scope.principal_id), generation)
                    decision = decide_supersede(
                        record,
                        SupersedeRequest(
                            request_fingerprint=request_fingerprint,
                            binding=binding,
                            force=force,
                            external=external,
                        ),
                        now,
                    )
                    if isinstance(decision, Refuse):
                        return decision
                    try:
                        await uow.cas_write(
                            decision.record,
                            decision.expected_revision,
                            at(now),
                            expected_tuple=decision.archived.tuple,
                            expires_at=None,
                            current_attempt_id=None,
                        )
                    except StaleRevision:
                        continue
                    await uow.archive_epoch(
                        operation_id, decision.archived, reason, admin_id, at(now)
                    )
                    await uow.commit()
                log.warning(
                    "operation superseded",
                    extra={
                        "operation_id": str(operation_id),
                        "binding_generation": decision.record.tuple.binding_generation,
                        "reran_completed": decision.reran_completed,
                        "fenced_live_attempt": decision.fenced_live_attempt,
                        "reason": reason,
                    },
                )
                return decision
        raise SettlementContention(f"operation {operation_id}: revision kept moving")

    async def get_by_scope(self, scope: Scope) -> Record | None:
        """The replay path's one indexed read (no lock)."""
        async with self._reader.connect() as conn:
            row = (
                (await conn.execute(select(operations).where(*scope_predicate(scope))))
                .mappings()
                .first()
            )
        return None if row is None else record_from_row(row)

    # -- the settlement path ------------------------------------------------------------------

    async def settle(
        self,
        operation_id: uuid.UUID,
        observation: Observation,
        *,
        attempt_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Settled:
        """Merge one observation into the row, under its lock, with the tuple + revision CAS."""

        async def given(conn: AsyncConnection, record: Record) -> Observation:
            return observation

        return await self._settle(
            operation_id, given, attempt_id=attempt_id, detail=detail, missing=observation
        )

    async def settle_local(
        self,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        effect: LocalEffect,
        *,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> Settled:
        """Run a local effect and settle its outcome in one transaction.

        The effect runs in a savepoint only while ``attempt`` holds the current fencing token
        of a non-terminal row; its rows are rolled back unless the core applies its outcome.
        A fenced-out or late attempt settles a probe (``unknown`` with its token) instead,
        which the core ignores: the stale worker's effect never commits.
        """

        async def produce(conn: AsyncConnection, record: Record) -> Observation:
            probe = Observation(
                tuple=attempt.reservation,
                kind=ObservationKind.UNKNOWN,
                source=Source.ATTEMPT,
                fencing_token=attempt.fencing_token,
            )
            current = record.tuple == attempt.reservation
            if (
                not current
                or record.fencing_token != attempt.fencing_token
                or record.state.terminal
            ):
                return probe
            return await effect(conn, record)

        return await self._settle(
            operation_id,
            produce,
            attempt_id=attempt.attempt_id,
            savepoint=True,
            before_commit=before_commit,
        )

    async def _settle(
        self,
        operation_id: uuid.UUID,
        produce: Callable[[AsyncConnection, Record], Awaitable[Observation]],
        *,
        attempt_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
        missing: Observation | None = None,
        savepoint: bool = False,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> Settled:
        with self._lock_timeouts():
            for round_ in range(1, self._max_retries + 1):
                async with self.unit_of_work() as uow:
                    record = await uow.get_for_update(operation_id)
                    if record is None:
                        if missing is not None:
                            await uow.record_observation(
                                operation_id,
                                missing,
                                stage="A",
                                disposition="quarantined",
                                reason="unknown-operation",
                                revision_before=None,
                                revision_after=None,
                                attempt_id=attempt_id,
                                detail=detail,
                            )
                            await uow.commit()
                        raise OperationNotFound(str(operation_id))
                    nested = await uow.connection.begin_nested() if savepoint else None
                    observation = await produce(uow.connection, record)
                    now = self._clock()
                    decision = settle(record, observation, now, self._policy)
                    after = record
                    if isinstance(decision, Apply):
                        after = decision.record
                        try:
                            await uow.cas_write(
                                after,
                                decision.expected_revision,
                                at(now),
                                **self._terminal_extra(record, after, now),
                            )
                        except StaleRevision:
                            log.warning(
                                "settle CAS refused, rerunning all stages",
                                extra={"operation_id": str(operation_id), "round": round_},
                            )
                            continue
                    elif nested is not None:
                        await nested.rollback()  # the core refused the outcome: undo its effect
                    finish = None
                    if attempt_id is not None and observation.source is Source.ATTEMPT:
                        finish = AttemptEnd(
                            attempt_id=attempt_id,
                            outcome=observation.kind.value,
                            status=observation.result.status if observation.result else None,
                            error=None if isinstance(decision, Apply) else decision.reason.value,
                            at=at(now),
                        )
                    observation_id = await uow.record_decision(
                        operation_id,
                        observation,
                        decision,
                        record.revision,
                        attempt_id=attempt_id,
                        detail=detail,
                        finish_attempt=finish,
                        notify_terminal=isinstance(decision, Apply) and after.state.terminal,
                    )
                    if before_commit is not None:
                        await before_commit()
                    await uow.commit()
                _log_decision(operation_id, observation, decision)
                self._hooks.on_settled(observation.source.value, decision.disposition.value)
                if _stale_epoch_outcome(record, observation):
                    self._hooks.on_stale_epoch_outcome()
                    log.error(
                        "a verified outcome of a superseded epoch arrived: the effect may have "
                        "happened in both epochs",
                        extra={
                            "operation_id": str(operation_id),
                            "observed_generation": observation.tuple.binding_generation,
                            "current_generation": record.tuple.binding_generation,
                            "kind": observation.kind.value,
                        },
                    )
                return Settled(
                    decision=decision,
                    record=after,
                    observation=observation,
                    observation_id=observation_id,
                )
        raise SettlementContention(f"operation {operation_id}: revision kept moving")

    async def claim(self, scope: Scope, request: ClaimRequest, **kwargs: Any) -> ClaimOutcome:
        """Claim the scope's operation for a new attempt, or say why not (one CAS).

        ``lease_held``: the caller holds the scope's lease, so no other attempt is live
        whatever the row's own lease column says; a row still in_progress is stale.
        ``assume_absent``: the caller just read no row for the scope; skip the locked read.
        Raises :class:`RowLocked` when the row stays locked past the lock timeout.
        """
        with self._lock_timeouts():
            return await self._claim(scope, request, **kwargs)

    async def _claim(
        self,
        scope: Scope,
        request: ClaimRequest,
        *,
        lease_token: str | None = None,
        lease_held: bool = False,
        assume_absent: bool = False,
    ) -> ClaimOutcome:
        for round_ in range(self._max_retries):
            async with self.unit_of_work() as uow:
                if assume_absent and round_ == 0:
                    # the caller's read found no row: try the insert straight away; if another
                    # claimer inserted meanwhile it does nothing and the next round locks
                    record = None
                else:
                    record = await uow.get_for_update_by_scope(scope)
                if record is not None and lease_held:
                    record = msgspec.structs.replace(record, lease_expires_at=None)
                now = self._clock()
                decision = decide_claim(record, request, now)
                if not isinstance(decision, Claim):
                    return ClaimOutcome(decision=decision, record=record)
                claimed = decision.record
                operation_id = uuid.UUID(claimed.tuple.operation_id)
                attempt_id = uuid.uuid4()
                stamp = at(now)
                if decision.kind is ClaimKind.NEW:
                    inserted = await uow.insert_operation(
                        scope, claimed, stamp, current_attempt_id=attempt_id
                    )
                    if not inserted:
                        continue  # another claimer inserted the scope first: decide again
                else:
                    assert record is not None and decision.expected_revision is not None
                    try:
                        await uow.cas_write(
                            claimed,
                            decision.expected_revision,
                            stamp,
                            current_attempt_id=attempt_id,
                        )
                    except StaleRevision:
                        continue
                    if decision.demotion is not None:
                        demoted = settle(record, decision.demotion, now, self._policy)
                        await uow.record_decision(
                            operation_id, decision.demotion, demoted, record.revision
                        )
                await uow.insert_attempt(attempt_id, claimed, lease_token, stamp)
                await uow.commit()
            self._hooks.on_claimed(decision.kind.value)
            log.info(
                "operation claimed",
                extra={
                    "operation_id": str(operation_id),
                    "claim": decision.kind.value,
                    "fencing_token": claimed.fencing_token,
                },
            )
            return ClaimOutcome(decision=decision, record=claimed, attempt_id=attempt_id)
        raise SettlementContention(f"scope {scope}: kept losing the claim race")

    def _terminal_extra(self, before: Record, after: Record, now: float) -> dict[str, Any]:
        """A row that becomes terminal starts its retention clock."""
        if after.state.terminal and not before.state.terminal:
            return {"expires_at": at(now) + timedelta(seconds=self._retention)}
        return {}


def _stale_epoch_outcome(record: Record, observation: Observation) -> bool:
    return (
        observation.verified
        and observation.kind.terminal
        and observation.fencing_token is None
        and observation.tuple.operation_id == record.tuple.operation_id
        and observation.tuple.binding_generation < record.tuple.binding_generation
    )


def _log_decision(operation_id: uuid.UUID, observation: Observation, decision: Decision) -> None:
    level = logging.ERROR if decision.disposition.value == "conflict" else logging.INFO
    log.log(
        level,
        "observation settled",
        extra={
            "operation_id": str(operation_id),
            "source": observation.source.value,
            "kind": observation.kind.value,
            "stage": decision.stage.value,
            "disposition": decision.disposition.value,
            "reason": decision.reason.value,
        },
    )
