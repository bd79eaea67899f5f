"""The pre-filled database of ``make bench-scale``: what a day of completed transfers leaves
behind, written with set-based SQL (``INSERT ... SELECT FROM generate_series``) in chunks.

Each filled operation is a ``POST /v1/transfers`` as the server settles a new one in one
statement (``service.store.hot_sql.claim_settle_with``): the operation row, terminal, with
its stored outcome; its attempt (begun and ended); the attempt's observation; and, when it
completed, its ledger row in ``transfers``. Column for column these are the rows a real
request writes, with the request fingerprint and the result digest computed in SQL by the
rules of ``service.evidence``, so a replay of a filled key with its request answers the
stored outcome and ``GET /v1/operations/{id}`` reads it. Balances are left as they are (the
filled transfers never moved money): setup, not ledger history.

The spread: ``FILLER_TENANTS`` tenants with ``PRINCIPALS_PER_TENANT`` client principals each,
plus the principals passed in (the bench client); a principal is drawn with a skew (the
first slots busiest, as a few large clients are); keys are UUIDs as clients make them;
``FAILED_SHARE`` of the operations failed (402, insufficient funds, no transfer row);
``created_at`` is spread uniformly over the ``retention`` before ``now`` and ``expires_at``
is ``retention`` after settlement, as the server sets it. So nothing filled has expired at
``now``: the table as it stands when the purge keeps up. The rows that expire within the next
``s`` seconds are the backlog a purge run ``s`` seconds ahead finds (``bench.scale``).

Every draw is a hash of the row number and ``seed``: the same arguments fill the same rows.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

__all__ = [
    "FAILED_SHARE",
    "FILLED_TABLES",
    "ROUTE",
    "Filled",
    "Owner",
    "fill",
]

ROUTE = "POST /v1/transfers"
# Tenants and client principals of the filler, besides the principals passed in.
FILLER_TENANTS = 20
PRINCIPALS_PER_TENANT = 5
# Account pairs each filler tenant's transfers spread over.
PAIRS_PER_TENANT = 10
# Share of operations that failed (402): a transfer refused for want of funds.
FAILED_SHARE = 0.03
# Rows per statement: one chunk is one transaction, with a progress line after it.
CHUNK = 100_000
# The lease an attempt held while it ran (service.config lease_ttl's default).
LEASE_SECONDS = 10.0
# The tables a filled operation writes to, in the order they are reported.
FILLED_TABLES = ("operations", "attempts", "observations", "transfers")


@dataclass(frozen=True)
class Owner:
    """A principal whose scope the filled rows may fall in, and its tenant's account pairs
    (source, destination) the transfers use."""

    tenant: str
    principal_id: uuid.UUID
    pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]


@dataclass(frozen=True)
class Filled:
    operations: int
    seconds: float
    chunks: int


_SLOTS = """
CREATE TEMPORARY TABLE IF NOT EXISTS scale_slots (
    slot int PRIMARY KEY,
    tenant varchar(128) NOT NULL,
    principal_id uuid NOT NULL,
    sources uuid[] NOT NULL,
    destinations uuid[] NOT NULL
)
"""

_FILLER_PRINCIPALS = """
INSERT INTO principals (id, tenant, name, role, key_hash)
SELECT md5($1 || '/principal/' || t || '/' || p)::uuid, $1 || '-t' || t, 'client-' || p,
       'client', sha256(convert_to($1 || '/key/' || t || '/' || p, 'UTF8'))
  FROM generate_series(1, $2::int) AS t, generate_series(1, $3::int) AS p
ON CONFLICT DO NOTHING
"""

_FILLER_ACCOUNTS = """
INSERT INTO accounts (id, tenant, currency, balance)
SELECT md5($1 || '/account/' || t || '/' || a)::uuid, $1 || '-t' || t, 'EUR', 1000000000000
  FROM generate_series(1, $2::int) AS t, generate_series(1, 2 * $3::int) AS a
ON CONFLICT DO NOTHING
"""

# $1 the first row number, $2 the last, $3 now, $4 the retention (s), $5 the failed share,
# $6 the seed, $7 the number of slots, $8 the attempt's lease (s).


def _u(k: int) -> str:
    """SQL of draw ``k`` for row ``g.i``: uniform in [0, 1), a hash of the row and the seed."""
    return f"((hashint8extended(g.i, $6::bigint * 8 + {k}) & 2147483647)::float8 / 2147483648)"


def _rows(tenant: bool) -> str:
    """The statement of one chunk; ``tenant``: attempts and observations have the column
    (migration 0018; before it, the fill of a database at 0017 leaves it out)."""
    into, of = ("tenant, ", "tenant, ") if tenant else ("", "")
    return f"""
WITH src AS MATERIALIZED (
    SELECT d.*,
           convert_to('{{"body":{{"amount":' || d.amount || ',"currency":"EUR","destination":"'
               || d.destination || '","memo":null,"source":"' || d.source
               || '"}},"path":{{}},"route":"{ROUTE}"}}', 'UTF8') AS request,
           CASE WHEN d.failed THEN 402 ELSE 201 END AS status,
           CASE WHEN d.failed THEN 'application/problem+json' ELSE 'application/json' END
               AS content_type,
           convert_to(CASE WHEN d.failed THEN
               '{{"type":"/problems/insufficient-funds","title":"Insufficient funds",'
               || '"status":402,"detail":"source balance ' || (d.amount - 1)
               || ' is below the amount ' || d.amount || '","operation_id":"' || d.op
               || '","state":"failed"}}'
           ELSE
               '{{"id":"' || d.tr || '","source":"' || d.source || '","destination":"'
               || d.destination || '","amount":' || d.amount
               || ',"currency":"EUR","memo":null,"created_at":"'
               || to_char(d.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
               || '"}}'
           END, 'UTF8') AS body
      FROM (
        SELECT g.i, s.tenant, s.principal_id,
               gen_random_uuid() AS op, gen_random_uuid() AS att, gen_random_uuid() AS tr,
               md5($6::text || '/key/' || g.i)::uuid::text AS key,
               md5($6::text || '/lease/' || g.i) AS lease_token,
               s.sources[1 + floor({_u(2)} * cardinality(s.sources))::int] AS source,
               s.destinations[1 + floor({_u(2)} * cardinality(s.sources))::int] AS destination,
               1 + floor({_u(3)} * 9999)::bigint AS amount,
               {_u(4)} < $5::float8 AS failed,
               $3::timestamptz - make_interval(secs => {_u(5)} * $4::float8) AS created_at
          FROM generate_series($1::bigint, $2::bigint) AS g(i)
          JOIN scale_slots s ON s.slot = floor($7::int * {_u(1)} * {_u(1)})::int
      ) AS d
), settled AS MATERIALIZED (
    SELECT src.*,
           encode(sha256(request), 'hex') AS fingerprint,
           encode(sha256(convert_to(status || E'\\n' || content_type || E'\\n', 'UTF8')
               || body), 'hex') AS digest,
           created_at + interval '1 millisecond' AS settled_at
      FROM src
), ops AS (
    INSERT INTO operations (id, tenant, principal_id, route, idempotency_key,
        binding_generation, request_fingerprint, bound_principal_id,
        bound_credential_generation, state, revision, fencing_token, current_attempt_id,
        lease_expires_at, result_status, result_content_type, result_body, result_digest,
        conflict, created_at, updated_at, expires_at)
    SELECT op, tenant, principal_id, '{ROUTE}', key, 1, fingerprint, principal_id, 1,
           CASE WHEN failed THEN 'failed' ELSE 'completed' END, 2, 1, att, NULL, status,
           content_type, body, digest, NULL, created_at, settled_at,
           settled_at + make_interval(secs => $4::float8)
      FROM settled
), begun AS (
    INSERT INTO attempts ({into}id, operation_id, fencing_token, binding_generation,
        lease_token, lease_expires_at, started_at, finished_at, outcome, response_status, error)
    SELECT {of}att, op, 1, 1, lease_token, created_at + make_interval(secs => $8::float8),
           created_at, settled_at, CASE WHEN failed THEN 'failed' ELSE 'completed' END,
           status, NULL
      FROM settled
), recorded AS (
    INSERT INTO observations ({into}operation_id, source, kind, binding_generation,
        request_fingerprint, fencing_token, verified, result_status, result_digest,
        lease_expires_at, stage, disposition, reason, revision_before, revision_after,
        attempt_id, detail, created_at)
    SELECT {of}op, 'attempt', CASE WHEN failed THEN 'failed' ELSE 'completed' END, 1,
           fingerprint, 1, true, status, digest, NULL, 'C', 'applied', 'terminal-applied',
           1, 2, att, NULL, settled_at
      FROM settled
), moved AS (
    INSERT INTO transfers (id, tenant, operation_id, binding_generation, source_id,
        destination_id, amount, currency, memo, created_at)
    SELECT tr, tenant, op, 1, source, destination, amount, 'EUR', NULL, created_at
      FROM settled WHERE NOT failed
)
SELECT count(*) FROM settled
"""


async def _slots(conn: asyncpg.Connection, owners: Sequence[Owner], seed: int) -> int:
    """The principals the rows are spread over (``owners`` first, then the filler's, made
    here with their accounts) in a temporary table; how many there are."""
    prefix = f"scale{seed}"
    await conn.execute(_FILLER_PRINCIPALS, prefix, FILLER_TENANTS, PRINCIPALS_PER_TENANT)
    await conn.execute(_FILLER_ACCOUNTS, prefix, FILLER_TENANTS, PAIRS_PER_TENANT)
    await conn.execute(_SLOTS)
    await conn.execute("TRUNCATE scale_slots")
    rows: list[tuple[int, str, uuid.UUID, list[uuid.UUID], list[uuid.UUID]]] = [
        (
            n,
            owner.tenant,
            owner.principal_id,
            [s for s, _ in owner.pairs],
            [d for _, d in owner.pairs],
        )
        for n, owner in enumerate(owners)
    ]
    for t in range(1, FILLER_TENANTS + 1):
        tenant = f"{prefix}-t{t}"
        accounts = [
            uuid.UUID(hex=_md5(f"{prefix}/account/{t}/{a}"))
            for a in range(1, 2 * PAIRS_PER_TENANT + 1)
        ]
        for p in range(1, PRINCIPALS_PER_TENANT + 1):
            rows.append(
                (
                    len(rows),
                    tenant,
                    uuid.UUID(hex=_md5(f"{prefix}/principal/{t}/{p}")),
                    accounts[0::2],
                    accounts[1::2],
                )
            )
    await conn.executemany("INSERT INTO scale_slots VALUES ($1, $2, $3, $4, $5)", rows)
    return len(rows)


def _md5(text: str) -> str:
    import hashlib

    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


async def fill(
    conn: asyncpg.Connection,
    operations: int,
    *,
    owners: Sequence[Owner],
    now: datetime,
    retention: float,
    seed: int = 1,
    failed_share: float = FAILED_SHARE,
    chunk: int = CHUNK,
    progress: Callable[[int, int, float], None] | None = None,
    tenant: bool = True,
) -> Filled:
    """Fill ``operations`` settled transfers (and their attempts, observations and transfer
    rows) in chunks of ``chunk``, one transaction each; ``progress(done, total, seconds)``
    after each. ``tenant=False``: a database before migration 0018, whose attempts and
    observations have no tenant."""
    rows = _rows(tenant)
    began = time.monotonic()
    slots = await _slots(conn, owners, seed)
    done = chunks = 0
    while done < operations:
        last = min(operations, done + chunk)
        await conn.execute(
            rows,
            done + 1,
            last,
            now,
            retention,
            failed_share,
            seed,
            slots,
            LEASE_SECONDS,
        )
        done, chunks = last, chunks + 1
        if progress is not None:
            progress(done, operations, time.monotonic() - began)
    return Filled(operations=done, seconds=time.monotonic() - began, chunks=chunks)
