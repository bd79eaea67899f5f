-- pgbench: the SQL of one new POST /v1/transfers, statement for statement and round trip for
-- round trip, as the server sends it (read from PostgreSQL's statement log); run with
-- -M prepared, as asyncpg prepares every statement.
-- Variables (-D): key_hash (hex), tenant, principal, pairs.
-- Not here: HTTP, Python, the Redis lease (SET NX PX, then a compare-and-delete).
\set p random(1, :pairs)
\set src 2 * :p - 1
\set dst 2 * :p
\set k random(1, 9000000000000000000)
-- authenticate
BEGIN;
SELECT id, tenant, name, role, key_hash, credential_generation, all_tenants, created_at, revoked_at
  FROM principals WHERE key_hash = decode(:key_hash, 'hex') AND revoked_at IS NULL;
ROLLBACK;
-- the replay read of the scope (no row yet)
BEGIN;
SELECT id, tenant, principal_id, route, idempotency_key, binding_generation, request_fingerprint,
       bound_principal_id, bound_credential_generation, state, revision, fencing_token,
       current_attempt_id, lease_expires_at, result_status, result_content_type, result_body,
       result_digest, conflict, created_at, updated_at, expires_at
  FROM operations
 WHERE tenant = :tenant AND principal_id = :principal::uuid AND route = 'POST /v1/transfers'
   AND idempotency_key = 'pgbench-' || :k::text;
ROLLBACK;
-- claim: lock the scope, insert the operation and its attempt
BEGIN;
SELECT id, tenant, principal_id, route, idempotency_key, binding_generation, request_fingerprint,
       bound_principal_id, bound_credential_generation, state, revision, fencing_token,
       current_attempt_id, lease_expires_at, result_status, result_content_type, result_body,
       result_digest, conflict, created_at, updated_at, expires_at
  FROM operations
 WHERE tenant = :tenant AND principal_id = :principal::uuid AND route = 'POST /v1/transfers'
   AND idempotency_key = 'pgbench-' || :k::text
   FOR UPDATE;
INSERT INTO operations (id, tenant, principal_id, route, idempotency_key, binding_generation,
       request_fingerprint, bound_principal_id, bound_credential_generation, state, revision,
       fencing_token, current_attempt_id, lease_expires_at, result_status, result_content_type,
       result_body, result_digest, conflict, created_at, updated_at)
VALUES (gen_random_uuid(), :tenant, :principal::uuid, 'POST /v1/transfers',
       'pgbench-' || :k::text, 1, md5(:k::text) || md5(:k::text), :principal::uuid, 1,
       'in_progress', 1, 1, gen_random_uuid(), now() + interval '10 seconds', NULL, NULL, NULL,
       NULL, 'null', now(), now())
ON CONFLICT ON CONSTRAINT uq_operations_scope DO NOTHING
RETURNING id AS op, current_attempt_id AS att, request_fingerprint AS fp \gset
INSERT INTO attempts (id, operation_id, fencing_token, binding_generation, lease_token,
       lease_expires_at, started_at)
VALUES (:att::uuid, :op::uuid, 1, 1, md5(:k::text), now() + interval '10 seconds', now());
COMMIT;
-- settle: lock the row, run the transfer in a savepoint, CAS the row, record the observation
BEGIN;
SELECT id, tenant, principal_id, route, idempotency_key, binding_generation, request_fingerprint,
       bound_principal_id, bound_credential_generation, state, revision, fencing_token,
       current_attempt_id, lease_expires_at, result_status, result_content_type, result_body,
       result_digest, conflict, created_at, updated_at, expires_at
  FROM operations WHERE id = :op::uuid FOR UPDATE;
SAVEPOINT sa_savepoint_1;
SELECT id, currency, balance FROM accounts
 WHERE id IN (('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid,
              ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid)
   AND tenant = :tenant
 ORDER BY id FOR UPDATE;
UPDATE accounts SET balance = balance - 1
 WHERE id = ('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid;
UPDATE accounts SET balance = balance + 1
 WHERE id = ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid;
INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id, destination_id,
       amount, currency, memo, created_at)
VALUES (gen_random_uuid(), :tenant, :op::uuid, 1,
       ('00000000-0000-4000-8000-' || lpad(:src::text, 12, '0'))::uuid,
       ('00000000-0000-4000-8000-' || lpad(:dst::text, 12, '0'))::uuid, 1, 'EUR', NULL, now());
UPDATE operations SET binding_generation = 1, request_fingerprint = :fp,
       bound_principal_id = :principal::uuid, bound_credential_generation = 1,
       state = 'completed', revision = 2, fencing_token = 1, lease_expires_at = NULL,
       result_status = 201, result_content_type = 'application/json',
       result_body = decode(repeat('7b', 229), 'hex'), result_digest = md5(:k::text) || md5(:fp),
       conflict = 'null', updated_at = now(), expires_at = now() + interval '1 day'
 WHERE id = :op::uuid AND request_fingerprint = :fp AND binding_generation = 1 AND revision = 1
RETURNING revision;
INSERT INTO observations (operation_id, source, kind, binding_generation, request_fingerprint,
       fencing_token, verified, result_status, result_digest, lease_expires_at, stage,
       disposition, reason, revision_before, revision_after, attempt_id, detail)
VALUES (:op::uuid, 'attempt', 'completed', 1, :fp, 1, true, 201, md5(:fp) || md5(:fp), NULL,
       'C', 'applied', 'terminal-applied', 1, 2, :att::uuid, 'null')
RETURNING id;
UPDATE attempts SET finished_at = now(), outcome = 'completed', response_status = 201,
       error = NULL
 WHERE id = :att::uuid;
SELECT pg_notify('settlement_terminal', :op);
COMMIT;
