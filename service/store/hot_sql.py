"""The SQL of the hot path (:mod:`service.store.hot`), prepared on asyncpg.

* ``IDENTIFY``: the caller's principal, its scope's row and the scope's tombstone.
* ``CLAIM_NEW``: a new operation row and its attempt row (its own transaction).
* ``LOCK``: the operation row under its lock; ``BY_SCOPE``: the scope's row, no lock.
* :func:`finish_with`: a local effect's SQL (``EffectStatement``), the row's CAS, the
  observation and the attempt's end, in one statement.
* :func:`claim_settle_with`: a new operation claimed, run and settled in one statement.

Both answer the observation's id (NULL: nothing was written) and the guard's ``refusal``
(NULL: the effect applied, or would have). ``NO_EFFECT_GUARD`` is the guard of no effect,
which never refuses: with it, either statement settles an outcome without an effect.

An operation is never inserted under a live tombstone: the schema's trigger (migration 0006)
fails such an insert with SQLSTATE SK410, which
:func:`service.store.phase.database_refusals` raises as ``KeyExpired``.
"""

from __future__ import annotations

import functools
import re

__all__ = [
    "BY_SCOPE",
    "CLAIM_NEW",
    "IDENTIFY",
    "LOCK",
    "NO_EFFECT_GUARD",
    "claim_settle_with",
    "finish_with",
    "with_effect",
]

_RECORD = """o.id, o.binding_generation, o.request_fingerprint, o.bound_principal_id,
    o.bound_credential_generation, o.state, o.revision, o.fencing_token, o.lease_expires_at,
    o.result_status, o.result_content_type, o.result_body, o.result_digest, o.conflict"""

IDENTIFY = f"""
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

CLAIM_NEW = """
WITH claimed AS (
    INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,
        binding_generation, request_fingerprint, bound_principal_id,
        bound_credential_generation, state, revision, fencing_token, current_attempt_id,
        lease_expires_at, created_at, updated_at)
    SELECT $1::uuid, $2::varchar, $3::uuid, $4::varchar, $5::varchar, $6::int, $7::varchar,
           $8::uuid, $9::int, $10::varchar, $11::bigint, $12::bigint, $13::uuid,
           $14::timestamptz, $15::timestamptz, $15::timestamptz
    ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
    RETURNING id
)
INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
    lease_expires_at, started_at)
SELECT $13, id, $12, $6, $16, $14, $15 FROM claimed
RETURNING operation_id
"""

LOCK = f"SELECT {_RECORD} FROM operations o WHERE o.id = $1 FOR UPDATE"

# the scope's row, no lock (a 409's re-read, Prefer: wait's)
BY_SCOPE = f"""SELECT {_RECORD} FROM operations o
 WHERE o.tenant = $1 AND o.principal_id = $2 AND o.route = $3 AND o.idempotency_key = $4"""

_OBSERVATION_COLUMNS = """operation_id, source, kind, binding_generation,
        request_fingerprint, fencing_token, verified, result_status, result_digest,
        lease_expires_at, stage, disposition, reason, revision_before, revision_after,
        attempt_id"""

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
_RECORDED = f"""recorded AS (
    INSERT INTO observations ({_OBSERVATION_COLUMNS})
    SELECT id, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $4, $10, $32
      FROM written
    RETURNING id
), closed AS (
    UPDATE attempts SET finished_at = $18, outcome = $21, response_status = $26
     WHERE id = $32 AND EXISTS (SELECT 1 FROM written)
)"""
FINISH_PARAMS = 32
_EFFECT_PLACEHOLDER = re.compile(r"\$E([1-9][0-9]*)")
# the guard's verdict, the effect's gate, and what each statement answers
_EFFECT_OK = "effect_ok AS (SELECT * FROM verdict WHERE refusal IS NULL)"
_ANSWER = """SELECT (SELECT id FROM recorded) AS observation_id,
       (SELECT refusal FROM verdict) AS refusal"""
NO_EFFECT_GUARD = "verdict AS (SELECT NULL::text[] AS refusal)"


def with_effect(guard: str, written: str, apply: str, *rest: str, offset: int) -> str:
    """The common table expressions of a statement carrying an effect's SQL (an
    ``EffectStatement``'s guard and writes): the guard, ``effect_ok`` (the guard's verdict
    when it lets the effect through), ``written`` (a write gated on ``effect_ok``, which
    gates the effect's writes), the writes, then ``rest``; ``$E<n>`` becomes
    ``$<offset + n>``."""

    def placed(sql: str) -> str:
        return _EFFECT_PLACEHOLDER.sub(lambda m: f"${offset + int(m[1])}", sql)

    parts = (placed(guard), _EFFECT_OK, written, placed(apply), *rest)
    return "WITH " + ",\n".join(part for part in parts if part)


@functools.lru_cache(maxsize=32)
def finish_with(guard: str, apply: str) -> str:
    """The finishing statement carrying an :class:`EffectStatement`'s SQL: its guard gates
    the CAS, the CAS gates its writes; ``$E<n>`` becomes ``$<32 + n>``."""
    written = _WRITTEN.format(gate="AND EXISTS (SELECT 1 FROM effect_ok)")
    return with_effect(guard, written, apply, _RECORDED, offset=FINISH_PARAMS) + "\n" + _ANSWER


# A new operation claimed, its effect run and its outcome settled, in one statement: the row
# is inserted as the core settled it (never in_progress), with its attempt (begun and ended)
# and the observation. $1-$21 the row, $22-$23 the attempt's lease token and claim-time
# lease, $24-$35 the observation, $36 the claim's revision, $37-$38 the attempt's fencing
# token and epoch; the effect's $E<n> follow.
CLAIM_SETTLE_PARAMS = 38
_CLAIMED_SETTLED = """written AS (
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
    ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
    RETURNING id
)"""
_BEGUN_ENDED = f"""begun AS (
    INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
        lease_expires_at, started_at, finished_at, outcome, response_status)
    SELECT $13::uuid, id, $37::bigint, $38::int, $22::varchar, $23::timestamptz,
           $15::timestamptz, $15::timestamptz, $25::varchar, $30::int
      FROM written
), recorded AS (
    INSERT INTO observations ({_OBSERVATION_COLUMNS})
    SELECT id, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35, $36, $11, $13
      FROM written
    RETURNING id
)"""


@functools.lru_cache(maxsize=32)
def claim_settle_with(guard: str, apply: str) -> str:
    """The one statement of a new operation with an :class:`EffectStatement`: its guard gates
    the insert of the settled row, the insert gates its writes; ``$E<n>`` becomes
    ``$<38 + n>``."""
    claimed = with_effect(guard, _CLAIMED_SETTLED, apply, _BEGUN_ENDED, offset=CLAIM_SETTLE_PARAMS)
    return claimed + "\n" + _ANSWER
