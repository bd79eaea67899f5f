"""The statements every request sends, prepared on asyncpg (:mod:`service.store.pool`).

* :meth:`HotPath.identify`: the caller's principal and its scope's row in one statement, no
  transaction around it: a replay needs nothing else from PostgreSQL.
* :meth:`HotPath.claim_new`: a new operation row and its attempt row in one statement (its
  own transaction), for a scope that had no row; None when another claimer inserted first.
* :meth:`HotPath.claim_and_settle`: a new operation claimed, its local effect run and its
  outcome settled in one statement (the effect written as SQL, ``EffectStatement``).
* :meth:`HotPath.settle_own`: a local effect and its settlement after a claim: first as one
  statement (with an ``EffectStatement``), else in one transaction: lock the row, run the
  effect, ask the core, then write the row (CAS on tuple + revision), the observation and
  the attempt's end in one statement.

The SQL is in :mod:`service.store.hot_sql`.

The rules are the store's (docs/design.md §4): the row is locked before the core decides, every
authoritative write is a CAS on the reservation tuple and revision, and what the core did
not apply never commits (the transaction is rolled back; the caller then records the
observation through the general settle path, without the effect).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from service.core import (
    Apply,
    Observation,
    ObservationKind,
    Record,
    Scope,
    TerminalPolicy,
    settle,
)
from service.store.hot_args import finish_args, observation_args, written_args
from service.store.hot_sql import (
    BY_SCOPE,
    CLAIM_NEW,
    FINISH,
    IDENTIFY,
    LOCK,
    claim_settle_with,
    finish_with,
)
from service.store.outcomes import AttemptRef, EffectStatement, LocalEffect, Settled
from service.store.phase import database_refusals
from service.store.principals import Principal, live_principal
from service.store.retention import Tombstone
from service.store.rows import at, record_from_row, record_values, to_ts
from service.store.unit_of_work import StaleRevision

__all__ = ["Fallback", "HotPath"]


class Fallback(msgspec.Struct, frozen=True):
    """The hot path settled nothing (its transaction rolled back): ``observation`` is what
    the attempt reports instead, to be recorded through the general settle path."""

    observation: Observation


class HotPath:
    def __init__(self, pool: Any) -> None:
        self._pool = pool

    async def identify(
        self, key_hash: bytes, route: str, idempotency_key: str
    ) -> tuple[Principal, Record | None, Tombstone | None] | None:
        """The live principal holding the key whose hash is ``key_hash``, the row of its
        scope (route, key) if there is one, and the scope's tombstone if there is one (one
        snapshot: a purge's delete and tombstone are seen together); None for an unknown or
        revoked key."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(IDENTIFY, key_hash, route, idempotency_key)
        principal = live_principal(row, key_hash, prefix="p_")
        if principal is None:
            return None
        record = None if row["id"] is None else record_from_row(row)
        tombstone = None
        if row["t_operation_id"] is not None:
            tombstone = Tombstone(
                tenant=principal.tenant,
                principal_id=principal.id,
                operation_id=row["t_operation_id"],
                request_fingerprint=row["t_request_fingerprint"],
                final_state=row["t_final_state"],
                expired_at=row["t_expired_at"],
                forget_at=row["t_forget_at"],
            )
        return principal, record, tombstone

    async def by_scope(self, scope: Scope) -> Record | None:
        """The scope's row, read without a lock."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                BY_SCOPE, scope.tenant, scope.principal_id, scope.route, scope.idempotency_key
            )
        return None if row is None else record_from_row(row)

    async def claim_new(
        self,
        scope: Scope,
        record: Record,
        attempt_id: uuid.UUID,
        lease_token: str | None,
        now: datetime,
    ) -> bool:
        """Insert ``record`` (the core's NEW claim) and its attempt; False when the scope
        already has a row (another claimer won; nothing was written). ``KeyExpired`` when
        the scope's tombstone stands."""
        binding = record.binding
        with database_refusals():  # a live tombstone: KeyExpired
            async with self._pool.acquire() as conn:
                inserted = await conn.fetchval(
                    CLAIM_NEW,
                    uuid.UUID(record.reservation.operation_id),
                    scope.tenant,
                    scope.principal_id,
                    scope.route,
                    scope.idempotency_key,
                    record.reservation.binding_generation,
                    record.reservation.request_fingerprint,
                    uuid.UUID(binding.principal_id),
                    binding.credential_generation,
                    record.state.value,
                    record.revision,
                    record.fencing_token,
                    attempt_id,
                    to_ts(record.lease_expires_at),
                    now,
                    lease_token,
                )
        return inserted is not None

    async def claim_and_settle(
        self,
        scope: Scope,
        claimed: Record,
        attempt_id: uuid.UUID,
        lease_token: str | None,
        statement: EffectStatement,
        *,
        now: float,
        policy: TerminalPolicy,
        retention: float,
    ) -> Settled | None:
        """A scope with no row: claim it (``claimed``, the core's NEW claim), run the effect
        and settle the attempt's outcome in one statement, its own transaction; the row is
        written once, already settled. None when nothing was written: the effect's guard
        refused, the core did not apply the outcome or another claimer's row exists (the
        caller then claims and runs the effect the general way, which says why).
        ``KeyExpired`` when the key's tombstone stands: nothing was written."""
        observation = statement.observation
        decision = settle(claimed, observation, now, policy)
        if not isinstance(decision, Apply):
            return None
        after = decision.record
        values = record_values(after)
        expires = at(now) + timedelta(seconds=retention) if after.state.terminal else None
        with database_refusals():
            async with self._pool.acquire() as conn:
                try:
                    row = await conn.fetchrow(
                        claim_settle_with(statement.guard, statement.apply),
                        uuid.UUID(claimed.reservation.operation_id),
                        scope.tenant,
                        scope.principal_id,
                        scope.route,
                        scope.idempotency_key,
                        *written_args(values),
                        attempt_id,
                        values["lease_expires_at"],
                        at(now),
                        values["result_status"],
                        values["result_content_type"],
                        values["result_body"],
                        values["result_digest"],
                        values["conflict"],
                        expires,
                        lease_token,
                        to_ts(claimed.lease_expires_at),
                        *observation_args(observation, decision),
                        decision.expected_revision,
                        claimed.fencing_token,
                        claimed.reservation.binding_generation,
                        *statement.args,
                    )
                except asyncpg.UniqueViolationError:
                    return None  # an effect row of this operation exists: the general way
        if row["observation_id"] is None:
            return None
        return Settled(
            decision=decision,
            record=after,
            observation=observation,
            observation_id=row["observation_id"],
        )

    async def settle_own(
        self,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        effect: LocalEffect,
        *,
        clock: Callable[[], float],
        policy: TerminalPolicy,
        retention: float,
        before_commit: Callable[[], Awaitable[None]] | None = None,
        statement: EffectStatement | None = None,
    ) -> tuple[Record, Settled] | Fallback | None:
        """Run ``effect`` for ``attempt`` and settle its outcome, in one transaction.

        With ``statement`` (the same effect as SQL) the first try is one statement: the
        effect's guard, the CAS on the claimed row, the effect's writes, the observation and
        the attempt's end. Should the guard refuse, the transactions below run ``effect`` (it
        explains the refusal); should the CAS find the row moved on, the locked round decides.

        Returns the row before and the settlement; a :class:`Fallback` when the row is not
        this attempt's to settle (fenced out, another epoch, already terminal: the effect
        does not run), when the outcome is ``failed`` (a business failure: whatever the
        effect wrote before failing is rolled back) or when the core did not apply the
        outcome (the effect is rolled back); None when there is no such operation.
        """
        with database_refusals():
            async with self._pool.acquire() as conn:
                # First without the row lock, on the row as the attempt's claim wrote it:
                # the finishing CAS proves the row is still exactly that. Should the CAS
                # find the row moved on, everything rolls back and the locked round decides.
                rounds = (attempt.claimed, None) if attempt.claimed is not None else (None,)
                if statement is not None and attempt.claimed is not None:
                    done = await self._settle_in_one_statement(
                        conn,
                        attempt,
                        attempt.claimed,
                        statement,
                        clock=clock,
                        policy=policy,
                        retention=retention,
                        before_commit=before_commit,
                    )
                    if isinstance(done, tuple):
                        return done
                    if done is _Missed.MOVED:
                        rounds = (None,)
                    # REFUSED: every round as below; the effect explains itself there
                for claimed in rounds:
                    try:
                        return await self._settle_own_once(
                            conn,
                            operation_id,
                            attempt,
                            claimed,
                            effect,
                            clock=clock,
                            policy=policy,
                            retention=retention,
                            before_commit=before_commit,
                        )
                    except _NotApplied as refused:
                        return Fallback(refused.observation)
                    except _Moved:
                        continue
                    except asyncpg.UniqueViolationError:
                        if claimed is None:
                            raise
                        # lock-free round: the effect's row of this epoch exists already, so
                        # another attempt took the operation over; the locked round decides
                        continue
        raise StaleRevision(f"operation {operation_id}: CAS refused under the row lock")

    async def _settle_in_one_statement(
        self,
        conn: Any,
        attempt: AttemptRef,
        claimed: Record,
        statement: EffectStatement,
        *,
        clock: Callable[[], float],
        policy: TerminalPolicy,
        retention: float,
        before_commit: Callable[[], Awaitable[None]] | None,
    ) -> tuple[Record, Settled] | _Missed:
        """The effect and its settlement as one statement (its own transaction) on the row
        as the claim wrote it; nothing is written unless all of it is."""
        observation = statement.observation
        now = clock()
        decision = settle(claimed, observation, now, policy)
        if not isinstance(decision, Apply):
            return _Missed.REFUSED  # the rounds decide again, and record what the core did
        after = decision.record
        expires = None
        if after.state.terminal and not claimed.state.terminal:
            expires = at(now) + timedelta(seconds=retention)
        if before_commit is not None:
            await before_commit()  # the statement is the commit: this is just before it
        try:
            row = await conn.fetchrow(
                finish_with(statement.guard, statement.apply),
                *finish_args(claimed, after, decision, at(now)),
                expires,
                *observation_args(observation, decision),
                attempt.attempt_id,
                *statement.args,
            )
        except asyncpg.UniqueViolationError:
            # the effect's row of this epoch exists already: another attempt took the
            # operation over; the locked round decides
            return _Missed.MOVED
        if row["observation_id"] is None:
            return _Missed.MOVED if row["effect_ok"] else _Missed.REFUSED
        settled = Settled(
            decision=decision,
            record=after,
            observation=observation,
            observation_id=row["observation_id"],
        )
        return claimed, settled

    async def _settle_own_once(
        self,
        conn: Any,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        claimed: Record | None,
        effect: LocalEffect,
        *,
        clock: Callable[[], float],
        policy: TerminalPolicy,
        retention: float,
        before_commit: Callable[[], Awaitable[None]] | None,
    ) -> tuple[Record, Settled] | Fallback | None:
        """One transaction: the row (``claimed``, or read under its lock), the effect, the
        core's decision and the finishing statement."""
        async with conn.transaction():
            record = claimed
            if record is None:
                row = await conn.fetchrow(LOCK, operation_id)
                if row is None:
                    return None
                record = record_from_row(row)
                if not _owns(attempt, record):
                    return Fallback(attempt.probe())
            observation = await effect(conn, record)
            if observation.kind is ObservationKind.FAILED:
                # a failed outcome is one where the effect did not happen: nothing it wrote
                # before failing may commit, so it is settled without them
                raise _NotApplied(observation)
            now = clock()
            decision = settle(record, observation, now, policy)
            if not isinstance(decision, Apply):
                raise _NotApplied(observation)
            after = decision.record
            expires = None
            if after.state.terminal and not record.state.terminal:
                expires = at(now) + timedelta(seconds=retention)
            observation_id = await conn.fetchval(
                FINISH,
                *finish_args(record, after, decision, at(now)),
                expires,
                *observation_args(observation, decision),
                attempt.attempt_id,
            )
            if observation_id is None:
                raise _Moved  # the CAS found another revision: roll back, lock, decide again
            if before_commit is not None:
                await before_commit()
            settled = Settled(
                decision=decision,
                record=after,
                observation=observation,
                observation_id=observation_id,
            )
            return record, settled


class _Missed(enum.Enum):
    """Why the one-statement try wrote nothing."""

    REFUSED = "the effect's guard (or the core) refused"
    MOVED = "the CAS found the row moved on"


class _Moved(Exception):
    """Rolls the hot transaction back: the row is no longer the one the attempt claimed."""


class _NotApplied(Exception):
    """Rolls the hot transaction back: the core did not apply the effect's outcome."""

    def __init__(self, observation: Observation) -> None:
        super().__init__("outcome not applied")
        self.observation = observation


def _owns(attempt: AttemptRef, record: Record) -> bool:
    """The row is still this attempt's: same epoch, its fencing token, not terminal."""
    return (
        record.reservation == attempt.reservation
        and record.fencing_token == attempt.fencing_token
        and not record.state.terminal
    )
