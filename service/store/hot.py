"""The statements every request sends, prepared on asyncpg (:mod:`service.store.pool`).

* :meth:`HotPath.identify`: the caller's principal and its scope's row in one statement, no
  transaction around it: a replay needs nothing else from PostgreSQL. The statement is given
  the key's tenant, which the process remembers once a request found it
  (:class:`service.store.principals.KeyTenants`); a key not remembered costs one statement
  more, the first time.
* :meth:`HotPath.claim_new`: a new operation row and its attempt row in one statement (its
  own transaction), for a scope that had no row; None when another claimer inserted first.

A local effect (its SQL, an ``EffectStatement``) settles one of two ways:

* :meth:`HotPath.claim_and_settle`, a scope with no row: the operation claimed, the effect
  run and its outcome settled in one statement, one round trip;
* :meth:`HotPath.settle_locked`, every other case (after a claim): one transaction that
  locks the row, asks the core, then runs the effect with the row's CAS (tuple + revision),
  the observation and the attempt's end in one statement.

Either way, when the effect's guard refuses, its refusal (a ``failed`` outcome) is settled
in the effect's place, the same way and with nothing of the effect written.

The SQL is in :mod:`service.store.hot_sql`.

The rules are the store's (docs/design.md §4): the row is locked before the core decides, every
authoritative write is a CAS on the reservation tuple and revision, and an effect commits
only with an outcome the core applied. In the one statement, what the core would not apply
writes nothing (the caller then claims and settles under the row's lock); under the lock,
it is recorded with its decision, the row and the effect unwritten.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from service.core import (
    Apply,
    Decision,
    Observation,
    Record,
    Scope,
    TerminalPolicy,
    settle,
)
from service.domain.principals import Principal
from service.store.hot_functions import hot_function, install
from service.store.hot_params import (
    claim_settle_params,
    finish_params,
    recorded_params,
    scope_params,
)
from service.store.hot_sql import (
    BY_SCOPE,
    CLAIM_NEW,
    IDENTIFY,
    LOCK,
    NO_EFFECT,
    RECORD_ALONE,
    TENANT_OF,
    claim_settle_with,
    finish_with,
)
from service.store.outcomes import AttemptRef, EffectSql, EffectStatement, Settled
from service.store.phase import database_refusals
from service.store.principals import KeyTenants, live_principal
from service.store.retention import Tombstone
from service.store.rows import at, record_from_row, record_values
from service.store.unit_of_work import StaleRevision

__all__ = ["HotPath"]

log = logging.getLogger("settlement.store")


class HotPath:
    def __init__(
        self, pool: Any, tenants: KeyTenants | None = None, *, functions: bool = False
    ) -> None:
        """``tenants``: the tenants of the keys remembered (default: a new one, default size);
        ``functions``: the claim-and-settle calls its effect's function
        (:mod:`service.store.hot_functions`, created by :meth:`install_functions`) instead of
        sending the statement."""
        self._pool = pool
        self._tenants = KeyTenants() if tenants is None else tenants
        self._functions = functions
        # the functions found missing since this opened (each logged once)
        self._missing: set[str] = set()

    def _missing_function(self, name: str) -> None:
        """Say once that ``name`` is missing (each new operation then sends its statement)."""
        if name not in self._missing:
            self._missing.add(name)
            log.error(
                "a claim-and-settle function is missing; new operations send its statement "
                "until a server that opens creates it again",
                extra={"function": name},
            )

    async def install_functions(self, effects: Iterable[EffectSql]) -> list[str]:
        """With ``functions``, create those of ``effects`` (and of a refusal, which settles
        without an effect) that the database lacks; the names created."""
        if not self._functions:
            return []
        async with self._pool.acquire() as conn:
            return await install(conn, (*effects, NO_EFFECT))

    async def identify(
        self, key_hash: bytes, route: str, idempotency_key: str, now: datetime
    ) -> tuple[Principal, Record | None, Tombstone | None] | None:
        """The live principal holding the key whose hash is ``key_hash``, the row of its
        scope (route, key) if there is one, and the scope's tombstone if it stands at ``now``
        (one snapshot: a purge's delete and tombstone are seen together); None for an unknown
        or revoked key.

        One statement for a key whose tenant is remembered, which still asks ``principals``
        whether the key is live; one more, before it, for a key that is not (None: an unknown
        key, remembered by nobody)."""
        values = {
            "key_hash": key_hash,
            "route": route,
            "idempotency_key": idempotency_key,
            "now": now,
            "tenant": self._tenants.get(key_hash),
        }
        async with self._pool.acquire() as conn:
            if values["tenant"] is None:
                values["tenant"] = await conn.fetchval(TENANT_OF.sql, *TENANT_OF.args(values))
                if values["tenant"] is None:
                    return None
            row = await conn.fetchrow(IDENTIFY.sql, *IDENTIFY.args(values))
        principal = live_principal(row, key_hash, prefix="p_")
        if principal is None:  # revoked or rotated out since it was remembered
            self._tenants.forget(key_hash)
            return None
        self._tenants.remember(key_hash, principal.tenant)
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
            row = await conn.fetchrow(BY_SCOPE.sql, *BY_SCOPE.args(scope_params(scope)))
        return None if row is None else record_from_row(row)

    async def claim_new(
        self,
        scope: Scope,
        record: Record,
        attempt_id: uuid.UUID,
        lease_token: str | None,
        now: datetime,
        canonical_request: str | None = None,
    ) -> bool:
        """Insert ``record`` (the core's NEW claim, ``canonical_request``: what its
        fingerprint covers) and its attempt; False when the scope already has a row (another
        claimer won; nothing was written). ``KeyExpired`` when the scope's tombstone stands."""
        with database_refusals():  # a live tombstone: KeyExpired
            async with self._pool.acquire() as conn:
                inserted = await conn.fetchval(
                    CLAIM_NEW.sql,
                    *CLAIM_NEW.args(
                        {
                            "id": uuid.UUID(record.reservation.operation_id),
                            **scope_params(scope),
                            **record_values(record),
                            "attempt_id": attempt_id,
                            "lease_token": lease_token,
                            "now": now,
                            "canonical_request": canonical_request,
                        }
                    ),
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
        canonical_request: str | None = None,
    ) -> Settled | None:
        """A scope with no row: claim it (``claimed``, the core's NEW claim;
        ``canonical_request``: what its fingerprint covers), run the effect
        and settle the attempt's outcome in one statement, its own transaction; the row is
        written once, already settled. Should the effect's guard refuse, its refusal is
        settled the same way (one more statement, without the effect). None when nothing was
        written: the core did not apply the outcome, or another claimer's row (or an effect
        row of this operation) exists; the caller then claims and settles under the row's
        lock. ``KeyExpired`` when the key's tombstone stands: nothing was written."""

        async def write(observation: Observation, effect: _Sql) -> tuple[Any, Apply] | None:
            decision = settle(claimed, observation, now, policy)
            if not isinstance(decision, Apply):
                return None
            expires = None
            if decision.record.state.terminal:
                expires = at(now) + timedelta(seconds=retention)
            sql, params = effect
            function = hot_function(sql) if self._functions else None
            statement = claim_settle_with(sql) if function is None else function.call
            values = claim_settle_params(
                scope,
                claimed,
                decision,
                observation,
                attempt_id,
                lease_token,
                at(now),
                expires,
                canonical_request,
            )
            args = {**values, **params}
            try:
                try:
                    row = await conn.fetchrow(statement.sql, *statement.args(args))
                except asyncpg.UndefinedFunctionError as exc:
                    # its name, not the message's words: those follow lc_messages
                    if function is None or function.name not in exc.message:
                        raise
                    # dropped since this server opened: the statement itself does the same
                    self._missing_function(function.name)
                    row = await conn.fetchrow(
                        function.statement.sql, *function.statement.args(args)
                    )
            except asyncpg.UniqueViolationError:
                return None  # an effect row of this operation exists
            return row, decision

        observation = statement.observation
        with database_refusals():
            async with self._pool.acquire() as conn:
                done = await write(observation, (statement.effect, statement.params))
                refusal = None if done is None else done[0]["refusal"]
                if refusal is not None:  # the guard refused: its problem is the outcome
                    observation = statement.refused(*refusal)
                    done = await write(observation, _NO_EFFECT)
        if done is None or done[0]["observation_id"] is None:
            return None
        row, decision = done
        return Settled(
            decision=decision,
            record=decision.record,
            observation=observation,
            observation_id=row["observation_id"],
        )

    async def settle_locked(
        self,
        tenant: str,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        statement: EffectStatement,
        *,
        clock: Callable[[], float],
        policy: TerminalPolicy,
        retention: float,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[Record, Settled] | None:
        """Run ``statement``'s effect for ``attempt`` on ``tenant``'s operation
        ``operation_id`` and settle its outcome, in one
        transaction: lock the row, ask the core, then one statement writes the effect (if its
        guard lets it through), the row (CAS on tuple + revision), the observation and the
        attempt's end. Should the guard refuse, its refusal is settled in the same
        transaction (one more statement, without the effect).

        When the row is not this attempt's to settle (fenced out, another epoch, already
        terminal), the effect does not run: the attempt's probe (``unknown`` under its token)
        is settled instead. What the core does not apply is recorded with its decision, the
        row unwritten. Returns the row before and the settlement; None when there is no such
        operation.
        """

        async def write(observation: Observation, effect: _Sql) -> tuple[Any, Any, Decision]:
            """(the observation's id, the guard's refusal, the core's decision)."""
            now = clock()
            decision = settle(record, observation, now, policy)
            if not isinstance(decision, Apply):  # recorded, the row and the effect unwritten
                values = recorded_params(
                    tenant, record, decision, observation, attempt.attempt_id, at(now)
                )
                return (
                    await conn.fetchval(RECORD_ALONE.sql, *RECORD_ALONE.args(values)),
                    None,
                    decision,
                )
            expires = None
            if decision.record.state.terminal and not record.state.terminal:
                expires = at(now) + timedelta(seconds=retention)
            sql, params = effect
            prepared = finish_with(sql)
            values = finish_params(
                tenant, record, decision, observation, attempt.attempt_id, at(now), expires
            )
            row = await conn.fetchrow(prepared.sql, *prepared.args({**values, **params}))
            return row["observation_id"], row["refusal"], decision

        with database_refusals():
            async with self._pool.acquire() as conn, conn.transaction():
                locked = await conn.fetchrow(
                    LOCK.sql, *LOCK.args({"id": operation_id, "tenant": tenant})
                )
                if locked is None:
                    return None
                record = record_from_row(locked)
                owned = _owns(attempt, record)
                if owned:
                    observation = statement.observation
                    effect: _Sql = (statement.effect, statement.params)
                else:  # the effect does not run
                    observation, effect = attempt.probe(), _NO_EFFECT
                observation_id, refusal, decision = await write(observation, effect)
                if refusal is not None:  # the guard refused: its problem is the outcome
                    observation = statement.refused(*refusal)
                    observation_id, _, decision = await write(observation, _NO_EFFECT)
                if observation_id is None:  # the CAS, refused under the row's lock
                    raise StaleRevision(f"operation {operation_id}: CAS refused under its lock")
                if before_commit is not None and owned:
                    await before_commit()
        after = decision.record if isinstance(decision, Apply) else record
        settled = Settled(
            decision=decision, record=after, observation=observation, observation_id=observation_id
        )
        return record, settled


# an effect's SQL and the values of its parameters
_Sql = tuple[EffectSql, Mapping[str, object]]
# what settles an outcome without an effect: a guard that never refuses, no writes
_NO_EFFECT: _Sql = (NO_EFFECT, {})


def _owns(attempt: AttemptRef, record: Record) -> bool:
    """The row is still this attempt's: same epoch, its fencing token, not terminal."""
    return (
        record.reservation == attempt.reservation
        and record.fencing_token == attempt.fencing_token
        and not record.state.terminal
    )
