-- pgbench: the SQL of one replay of POST /v1/transfers, as the server sends it
-- (service/store/hot.py): the principal and its scope's row in one statement, no
-- transaction. Run with -M prepared, as asyncpg prepares every statement.
-- Variables (-D): key_hash (hex), tenant, principal, seeded (keys replay-1 .. replay-N).
\set i random(1, :seeded)
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
   AND o.idempotency_key = 'replay-' || :i::text
  LEFT JOIN tombstones t
    ON t.tenant = p.tenant AND t.principal_id = p.id AND t.route = 'POST /v1/transfers'
   AND t.idempotency_key = 'replay-' || :i::text
 WHERE p.key_hash = decode(:key_hash, 'hex') AND p.revoked_at IS NULL;
