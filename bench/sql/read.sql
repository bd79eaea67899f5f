-- pgbench: the SQL of one replay of POST /v1/transfers, as the server sends it (read from
-- PostgreSQL's statement log): authenticate, then the one indexed read of the scope, each in
-- its own BEGIN ... ROLLBACK. Run with -M prepared, as asyncpg prepares every statement.
-- Variables (-D): key_hash (hex), tenant, principal, seeded (keys replay-1 .. replay-N).
\set i random(1, :seeded)
BEGIN;
SELECT id, tenant, name, role, key_hash, credential_generation, all_tenants, created_at, revoked_at
  FROM principals WHERE key_hash = decode(:key_hash, 'hex') AND revoked_at IS NULL;
ROLLBACK;
BEGIN;
SELECT id, tenant, principal_id, route, idempotency_key, binding_generation, request_fingerprint,
       bound_principal_id, bound_credential_generation, state, revision, fencing_token,
       current_attempt_id, lease_expires_at, result_status, result_content_type, result_body,
       result_digest, conflict, created_at, updated_at, expires_at
  FROM operations
 WHERE tenant = :tenant AND principal_id = :principal::uuid AND route = 'POST /v1/transfers'
   AND idempotency_key = 'replay-' || :i::text;
ROLLBACK;
