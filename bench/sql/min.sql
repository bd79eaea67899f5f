-- pgbench: the least SQL any transfer needs, whoever makes it idempotent: lock both accounts
-- in id order, two balance updates, the transfer row, one commit. transfers.operation_id is a
-- NOT NULL foreign key to operations, so a minimal operation row comes first (as in
-- bench.bare_app's plain transfer and bench.peer_app). Run with -M prepared.
-- Variables (-D): tenant, principal, pairs.
\set p random(1, :pairs)
\set src 2 * :p - 1
\set dst 2 * :p
BEGIN;
INSERT INTO operations (id, tenant, principal_id, route, idempotency_key, binding_generation,
       request_fingerprint, bound_principal_id, bound_credential_generation, state, revision,
       fencing_token)
VALUES (gen_random_uuid(), :tenant, :principal::uuid, 'pgbench-min', gen_random_uuid()::text, 1,
       repeat('0', 64), :principal::uuid, 1, 'unknown', 1, 1)
RETURNING id AS op \gset
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
COMMIT;
