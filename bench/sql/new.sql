-- pgbench: the SQL of one new POST /v1/transfers, statement for statement and round trip for
-- round trip, as the server sends it (service/store/hot.py, service/domain/ledger.py); run
-- with -M prepared, as asyncpg prepares every statement.
-- Variables (-D): key_hash (hex), tenant, principal, pairs.
-- Not here: HTTP, Python, the Redis lease (SET NX PX, then a compare-and-delete).
\set p random(1, :pairs)
\set src 2 * :p - 1
\set dst 2 * :p
\set k random(1, 9000000000000000000)
-- identify: the principal and its scope's row (none yet), no transaction
SELECT p.id AS p_id, p.tenant AS p_tenant, p.name AS p_name, p.role AS p_role,
       p.key_hash AS p_key_hash, p.credential_generation AS p_credential_generation,
       p.all_tenants AS p_all_tenants, o.id, o.binding_generation, o.request_fingerprint,
       o.bound_principal_id, o.bound_credential_generation, o.state, o.revision,
       o.fencing_token, o.lease_expires_at, o.result_status, o.result_content_type,
       o.result_body, o.result_digest, o.conflict,
       t.operation_id AS t_operation_id, t.request_fingerprint AS t_request_fingerprint,
       t.final_state AS t_final_state, t.expired_at AS t_expired_at,
       t.forget_at AS t_forget_at
  FROM principals p
  LEFT JOIN operations o
    ON o.tenant = p.tenant AND o.principal_id = p.id AND o.route = 'POST /v1/transfers'
   AND o.idempotency_key = 'pgbench-' || :k::text
  LEFT JOIN tombstones t
    ON t.tenant = p.tenant AND t.principal_id = p.id AND t.route = 'POST /v1/transfers'
   AND t.idempotency_key = 'pgbench-' || :k::text
 WHERE p.key_hash = decode(:key_hash, 'hex') AND p.revoked_at IS NULL;
-- claim, transfer and settlement: one statement, its own transaction (service/store/hot.py
-- _claim_settle_with with service/domain/ledger.py's guard and writes): lock both accounts
-- in id order and check the rules; if they pass, insert the operation row already settled;
-- if it was inserted, the transfer's writes, the attempt (begun and ended) and the
-- observation. The wake-up rides with the lease's release in Redis.
WITH locked AS (
    SELECT id, currency, balance FROM accounts
     WHERE id = ANY(ARRAY[('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid,
                          ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid])
       AND tenant = :tenant
     ORDER BY id FOR UPDATE
), effect_ok AS (
    SELECT 1 FROM locked s, locked d
     WHERE s.id = ('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid
       AND d.id = ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid
       AND s.currency = 'EUR' AND d.currency = 'EUR'
       AND s.balance >= 1 AND d.balance + 1 <= 1000000000000000
), written AS (
    INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,
        binding_generation, request_fingerprint, bound_principal_id,
        bound_credential_generation, state, revision, fencing_token, current_attempt_id,
        lease_expires_at, created_at, updated_at, result_status, result_content_type,
        result_body, result_digest, conflict, expires_at)
    SELECT md5('op' || :k::text)::uuid, :tenant, :principal::uuid, 'POST /v1/transfers',
           'pgbench-' || :k::text, 1, md5(:k::text) || md5(:k::text), :principal::uuid, 1,
           'completed', 2, 1, md5('at' || :k::text)::uuid, NULL, now(), now(), 201,
           'application/json', decode(repeat('7b', 229), 'hex'),
           md5(:k::text) || md5(:k::text), NULL, now() + interval '1 day'
     WHERE EXISTS (SELECT 1 FROM effect_ok)
    ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
    RETURNING id
), debit AS (
    UPDATE accounts SET balance = balance - 1
     WHERE id = ('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid
       AND EXISTS (SELECT 1 FROM written)
), credit AS (
    UPDATE accounts SET balance = balance + 1
     WHERE id = ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid
       AND EXISTS (SELECT 1 FROM written)
), moved AS (
    INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id,
        destination_id, amount, currency, memo, created_at)
    SELECT gen_random_uuid(), :tenant, md5('op' || :k::text)::uuid, 1,
           ('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid,
           ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid, 1, 'EUR', NULL, now()
     WHERE EXISTS (SELECT 1 FROM written)
), begun AS (
    INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
        lease_expires_at, started_at, finished_at, outcome, response_status)
    SELECT md5('at' || :k::text)::uuid, id, 1, 1, md5(:k::text),
           now() + interval '10 seconds', now(), now(), 'completed', 201
      FROM written
), recorded AS (
    INSERT INTO observations (operation_id, source, kind, binding_generation,
        request_fingerprint, fencing_token, verified, result_status, result_digest,
        lease_expires_at, stage, disposition, reason, revision_before, revision_after,
        attempt_id)
    SELECT id, 'attempt', 'completed', 1, md5(:k::text) || md5(:k::text), 1, true, 201,
           md5(:k::text) || md5(:k::text), NULL, 'C', 'applied', 'terminal-applied', 1, 2,
           md5('at' || :k::text)::uuid
      FROM written
    RETURNING id
)
SELECT (SELECT id FROM recorded) AS observation_id,
       EXISTS (SELECT 1 FROM effect_ok) AS effect_ok;
