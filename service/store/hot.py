"""The statements every request sends, prepared on asyncpg (:mod:`service.store.pool`).

* :meth:`HotPath.identify`: the caller's principal and its scope's row in one statement, no
  transaction around it: a replay needs nothing else from PostgreSQL.
* :meth:`HotPath.claim_new`: a new operation row and its attempt row in one statement (its
  own transaction), for a scope that had no row; None when another claimer inserted first.
* :meth:`HotPath.settle_own`: a local effect and its settlement in one transaction: lock the
  row, run the effect, ask the core, then write the row (CAS on tuple + revision), the
  observation and the attempt's end in one statement.

The rules are the store's (DESIGN §4): the row is locked before the core decides, every
authoritative write is a CAS on the reservation tuple and revision, and what the core did
not apply never commits (the transaction is rolled back; the caller then records the
observation through the general settle path, without the effect).
"""

from __future__ import annotations

import enum
import functools
import re
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
from service.store.outcomes import AttemptRef, EffectStatement, LocalEffect, Settled
from service.store.phase import lock_timeouts
from service.store.principals import Principal, live_principal
from service.store.retention import Tombstone
from service.store.rows import at, record_from_row, record_values, to_ts
from service.store.unit_of_work import StaleRevision

__all__ = ["Fallback", "HotPath"]

_RECORD = """o.id, o.binding_generation, o.request_fingerprint, o.bound_principal_id,
    o.bound_credential_generation, o.state, o.revision, o.fencing_token, o.lease_expires_at,
    o.result_status, o.result_content_type, o.result_body, o.result_digest, o.conflict"""

_IDENTIFY = f"""
SELECT p.id AS p_id, p.tenant AS p_tenant, p.name AS p_name, p.role AS p_role,
       p.key_hash AS p_key_hash, p.credential_generation AS p_credential_generation,
       p.all_tenants AS p_all_tenants, {_RECORD},
       t.operation_id AS t_operation_id, t.request_fingerprint AS t_request_fingerprint,
       t.final_state AS t_final_state, t.expired_at AS t_expired_at,
       t.forget_at AS t_forget_at
  FROM principals p
  LEFT JOIN operations o
    ON o.tenant = p.tenant AND o.principal_id = p.id AND o.route = $2
   AND o.idempotency_key = $3
  LEFT JOIN tombstones t
    ON t.tenant = p.tenant AND t.principal_id = p.id AND t.route = $2
   AND t.idempotency_key = $3
 WHERE p.key_hash = $1 AND p.revoked_at IS NULL
"""

# a key whose operation was purged (a live tombstone) is never claimed anew: $2-$5 the
# scope, $15 now
_NO_LIVE_TOMBSTONE = """NOT EXISTS (
        SELECT 1 FROM tombstones t
         WHERE t.tenant = $2::varchar AND t.principal_id = $3::uuid AND t.route = $4::varchar
           AND t.idempotency_key = $5::varchar AND t.forget_at > $15::timestamptz)"""

_CLAIM_NEW = f"""
WITH claimed AS (
    INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,
        binding_generation, request_fingerprint, bound_principal_id,
        bound_credential_generation, state, revision, fencing_token, current_attempt_id,
        lease_expires_at, created_at, updated_at)
    SELECT $1::uuid, $2::varchar, $3::uuid, $4::varchar, $5::varchar, $6::int, $7::varchar,
           $8::uuid, $9::int, $10::varchar, $11::bigint, $12::bigint, $13::uuid,
           $14::timestamptz, $15::timestamptz, $15::timestamptz
     WHERE {_NO_LIVE_TOMBSTONE}
    ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
    RETURNING id
)
INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
    lease_expires_at, started_at)
SELECT $13, id, $12, $6, $16, $14, $15 FROM claimed
RETURNING operation_id
"""

_LOCK = f"SELECT {_RECORD} FROM operations o WHERE o.id = $1 FOR UPDATE"

# $1-$4: the CAS (id, fingerprint, generation, revision); $5-$19: the row after;
# $20-$31: the observation; $32: the attempt. {gate}: an extra condition of the CAS.
_WRITTEN = """written AS (
    UPDATE operations
       SET binding_generation = $5, request_fingerprint = $6, bound_principal_id = $7,
           bound_credential_generation = $8, state = $9, revision = $10, fencing_token = $11,
           lease_expires_at = $12, result_status = $13, result_content_type = $14,
           result_body = $15, result_digest = $16, conflict = $17, updated_at = $18,
           expires_at = COALESCE($19, expires_at)
     WHERE id = $1 AND request_fingerprint = $2 AND binding_generation = $3 AND revision = $4
           {gate}
    RETURNING id
)"""
_RECORDED = """recorded AS (
    INSERT INTO observations (operation_id, source, kind, binding_generation,
        request_fingerprint, fencing_token, verified, result_status, result_digest,
        lease_expires_at, stage, disposition, reason, revision_before, revision_after,
        attempt_id)
    SELECT id, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $4, $10, $32
      FROM written
    RETURNING id
), closed AS (
    UPDATE attempts SET finished_at = $18, outcome = $21, response_status = $26
     WHERE id = $32 AND EXISTS (SELECT 1 FROM written)
)"""
_FINISH_PARAMS = 32
_FINISH = f"WITH {_WRITTEN.format(gate='')},\n{_RECORDED}\nSELECT id FROM recorded"
_EFFECT_PLACEHOLDER = re.compile(r"\$E([1-9][0-9]*)")


@functools.lru_cache(maxsize=32)
def _finish_with(guard: str, apply: str) -> str:
    """The finishing statement carrying an :class:`EffectStatement`'s SQL: its guard gates
    the CAS, the CAS gates its writes; ``$E<n>`` becomes ``$<32 + n>``."""

    def placed(sql: str) -> str:
        return _EFFECT_PLACEHOLDER.sub(lambda m: f"${_FINISH_PARAMS + int(m[1])}", sql)

    written = _WRITTEN.format(gate="AND EXISTS (SELECT 1 FROM effect_ok)")
    return (
        f"WITH {placed(guard)},\n{written},\n{placed(apply)},\n{_RECORDED}\n"
        "SELECT (SELECT id FROM recorded) AS observation_id,\n"
        "       EXISTS (SELECT 1 FROM effect_ok) AS effect_ok"
    )


# A new operation claimed, its effect run and its outcome settled, in one statement: the row
# is inserted as the core settled it (never in_progress), with its attempt (begun and ended)
# and the observation. $1-$21 the row, $22-$23 the attempt's lease token and claim-time
# lease, $24-$35 the observation, $36 the claim's revision, $37-$38 the attempt's fencing
# token and epoch; the effect's $E<n> follow.
_CLAIM_SETTLE_PARAMS = 38
_CLAIMED_SETTLED = f"""written AS (
    INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,
        binding_generation, request_fingerprint, bound_principal_id,
        bound_credential_generation, state, revision, fencing_token, current_attempt_id,
        lease_expires_at, created_at, updated_at, result_status, result_content_type,
        result_body, result_digest, conflict, expires_at)
    SELECT $1::uuid, $2::varchar, $3::uuid, $4::varchar, $5::varchar, $6::int, $7::varchar,
           $8::uuid, $9::int, $10::varchar, $11::bigint, $12::bigint, $13::uuid,
           $14::timestamptz, $15::timestamptz, $15::timestamptz, $16::int, $17::varchar,
           $18::bytea, $19::varchar, $20::jsonb, $21::timestamptz
     WHERE EXISTS (SELECT 1 FROM effect_ok)
       AND {_NO_LIVE_TOMBSTONE}
    ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
    RETURNING id
)"""
_BEGUN_ENDED = """begun AS (
    INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
        lease_expires_at, started_at, finished_at, outcome, response_status)
    SELECT $13::uuid, id, $37::bigint, $38::int, $22::varchar, $23::timestamptz,
           $15::timestamptz, $15::timestamptz, $25::varchar, $30::int
      FROM written
), recorded AS (
    INSERT INTO observations (operation_id, source, kind, binding_generation,
        request_fingerprint, fencing_token, verified, result_status, result_digest,
        lease_expires_at, stage, disposition, reason, revision_before, revision_after,
        attempt_id)
    SELECT id, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $11, $13
      FROM written
    RETURNING id
)"""


@functools.lru_cache(maxsize=32)
def _claim_settle_with(guard: str, apply: str) -> str:
    """The one statement of a new operation with an :class:`EffectStatement`: its guard gates
    the insert of the settled row, the insert gates its writes; ``$E<n>`` becomes
    ``$<38 + n>``."""

    def placed(sql: str) -> str:
        return _EFFECT_PLACEHOLDER.sub(lambda m: f"${_CLAIM_SETTLE_PARAMS + int(m[1])}", sql)

    return (
        f"WITH {placed(guard)},\n{_CLAIMED_SETTLED},\n{placed(apply)},\n{_BEGUN_ENDED}\n"
        "SELECT (SELECT id FROM recorded) AS observation_id,\n"
        "       EXISTS (SELECT 1 FROM effect_ok) AS effect_ok"
    )


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
            row = await conn.fetchrow(_IDENTIFY, key_hash, route, idempotency_key)
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

    async def claim_new(
        self,
        scope: Scope,
        record: Record,
        attempt_id: uuid.UUID,
        lease_token: str | None,
        now: datetime,
    ) -> bool:
        """Insert ``record`` (the core's NEW claim) and its attempt; False when the scope
        already has a row (another claimer won; nothing was written)."""
        binding = record.binding
        async with self._pool.acquire() as conn:
            inserted = await conn.fetchval(
                _CLAIM_NEW,
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
        refused, the core did not apply the outcome, another claimer's row exists, or the
        key's tombstone stands (the caller then claims and runs the effect the general way,
        which says why)."""
        observation = statement.observation
        decision = settle(claimed, observation, now, policy)
        if not isinstance(decision, Apply):
            return None
        after = decision.record
        values = record_values(after)
        expires = at(now) + timedelta(seconds=retention) if after.state.terminal else None
        with lock_timeouts():
            async with self._pool.acquire() as conn:
                try:
                    row = await conn.fetchrow(
                        _claim_settle_with(statement.guard, statement.apply),
                        uuid.UUID(claimed.reservation.operation_id),
                        scope.tenant,
                        scope.principal_id,
                        scope.route,
                        scope.idempotency_key,
                        values["binding_generation"],
                        values["request_fingerprint"],
                        values["bound_principal_id"],
                        values["bound_credential_generation"],
                        values["state"],
                        values["revision"],
                        values["fencing_token"],
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
                        *_observation_args(observation, decision),
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
        with lock_timeouts():
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
                _finish_with(statement.guard, statement.apply),
                *_finish_args(claimed, after, decision, at(now)),
                expires,
                *_observation_args(observation, decision),
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
                row = await conn.fetchrow(_LOCK, operation_id)
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
                _FINISH,
                *_finish_args(record, after, decision, at(now)),
                expires,
                *_observation_args(observation, decision),
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


def _finish_args(before: Record, after: Record, decision: Apply, now: datetime) -> tuple[Any, ...]:
    values = record_values(after)
    return (
        uuid.UUID(before.reservation.operation_id),
        before.reservation.request_fingerprint,
        before.reservation.binding_generation,
        decision.expected_revision,
        values["binding_generation"],
        values["request_fingerprint"],
        values["bound_principal_id"],
        values["bound_credential_generation"],
        values["state"],
        values["revision"],
        values["fencing_token"],
        values["lease_expires_at"],
        values["result_status"],
        values["result_content_type"],
        values["result_body"],
        values["result_digest"],
        values["conflict"],
        now,
    )


def _observation_args(observation: Observation, decision: Apply) -> tuple[Any, ...]:
    result = observation.result
    return (
        observation.source.value,
        observation.kind.value,
        observation.reservation.binding_generation,
        observation.reservation.request_fingerprint,
        observation.fencing_token,
        observation.verified,
        result.status if result else None,
        result.digest if result else None,
        to_ts(observation.lease_expires_at),
        decision.stage.value,
        decision.disposition.value,
        decision.reason.value,
    )
