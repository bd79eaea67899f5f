"""pgbench scripts of the server's own SQL, written at run time from the statements the
server sends (:mod:`service.store.hot_sql` with the ledger's guard and writes), so the
``pgbench-new`` and ``pgbench-read`` rows measure today's statements, never a copy that went
stale. Each named parameter of a statement becomes a pgbench expression of the script's variables
(``-D``: key_hash, tenant, principal, pairs, seeded); run with ``-M prepared``, as asyncpg
prepares every statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

from service.domain import ledger
from service.store.hot_sql import IDENTIFY, Prepared, claim_settle_with
from service.store.prepared import PLACEHOLDER

__all__ = ["NEW", "READ", "write_scripts"]

NEW = "new.sql"
READ = "read.sql"

ROUTE = "'POST /v1/transfers'::varchar"


def _account(variable: str) -> str:
    """The bench fixture's account number ``variable`` (bench.fixtures: 1..2*pairs)."""
    return f"('00000000-0000-4000-8000-' || lpad(:{variable}::text, 12, '0'))::uuid"


def _bound(statement: Prepared, values: Mapping[str, str]) -> str:
    """``statement``'s SQL with each ``$n`` replaced by the value of its parameter's name
    (parenthesized); every parameter must have one, and every value a parameter."""
    if set(statement.names) != set(values):
        missing = sorted(set(statement.names) - set(values))
        unused = sorted(set(values) - set(statement.names))
        raise ValueError(f"the script lacks {missing} and gives {unused} in vain")
    return (
        PLACEHOLDER.sub(
            lambda m: f"({values[statement.names[int(m[1]) - 1]]})", statement.sql
        ).strip()
        + ";"
    )


_OPERATION = "md5('op' || :k::text)::uuid"
_FINGERPRINT = "(md5(:k::text) || md5(:k::text))::varchar"
_KEY = "('pgbench-' || :k::text)::varchar"

# the one statement of a new transfer (hot_params.claim_settle_params' names): the row as the
# core settles a completed transfer, its attempt begun and ended, its observation
_SETTLED_ROW = {
    "id": _OPERATION,
    "tenant": ":tenant::varchar",
    "principal_id": ":principal::uuid",
    "route": ROUTE,
    "idempotency_key": _KEY,
    "binding_generation": "1::int",
    "request_fingerprint": _FINGERPRINT,
    "bound_principal_id": ":principal::uuid",
    "bound_credential_generation": "1::int",
    "state": "'completed'::varchar",
    "revision": "2::bigint",  # after the claim and the settlement
    "fencing_token": "1::bigint",
    "lease_expires_at": "NULL::timestamptz",  # none once settled
    "result_status": "201::int",
    "result_content_type": "'application/json'::varchar",
    "result_body": "decode(repeat('7b', 229), 'hex')",  # a transfer's answer is ~229 bytes
    "result_digest": _FINGERPRINT,  # 64 hex characters
    "conflict": "NULL::jsonb",
    "canonical_request": "repeat('x', 193)::text",  # a transfer's request is ~193 bytes
    "expires_at": "now() + interval '1 day'",
    "now": "now()",
    "attempt_id": "md5('at' || :k::text)::uuid",
    "lease_token": "md5(:k::text)::varchar",
    "attempt_fencing_token": "1::bigint",
    "attempt_generation": "1::int",
    "attempt_lease_expires_at": "now() + interval '10 seconds'",  # the claim-time lease
    "o_source": "'attempt'::varchar",
    "o_kind": "'completed'::varchar",
    "o_binding_generation": "1::int",
    "o_request_fingerprint": _FINGERPRINT,
    "o_fencing_token": "1::bigint",
    "o_verified": "true",
    "o_result_status": "201::int",
    "o_result_digest": _FINGERPRINT,
    "o_lease_expires_at": "NULL::timestamptz",
    "o_stage": "'C'::varchar",
    "o_disposition": "'applied'::varchar",
    "o_reason": "'terminal-applied'::varchar",
    "expected_revision": "1::bigint",
}
# ledger.transfer_values's parameters: one unit from account 2p-1 to account 2p, in EUR
_TRANSFER = {
    "e_accounts": f"ARRAY[{_account('src')}, {_account('dst')}]",  # both, in id order
    "e_tenant": ":tenant::varchar",
    "e_source": _account("src"),
    "e_destination": _account("dst"),
    "e_amount": "1::bigint",
    "e_currency": "'EUR'::varchar",
    "e_limit": f"{ledger.MAX_AMOUNT}::bigint",
    "e_transfer_id": "gen_random_uuid()",
    "e_operation_id": _OPERATION,
    "e_binding_generation": "1::int",
    "e_memo": "NULL::varchar",
    "e_created_at": "now()",
}


def _identify(key: str) -> str:
    """The principal and its scope's row: the first statement of every request."""
    values = {
        "key_hash": "decode(:key_hash, 'hex')",
        "route": ROUTE,
        "idempotency_key": key,
        "now": "now()",
        "tenant": ":tenant::varchar",  # the key's tenant, which the server remembers
    }
    return _bound(IDENTIFY, values)


def new_transfer_script() -> str:
    params, _ = ledger.transfer_values("t", uuid.uuid4(), 1, _SAMPLE_TRANSFER)
    if set(params) != set(_TRANSFER):
        raise ValueError("bench/pgbench_sql.py no longer gives the transfer's parameters")
    settle = _bound(claim_settle_with(ledger.TRANSFER), {**_SETTLED_ROW, **_TRANSFER})
    return "\n".join(
        [
            "-- pgbench: the SQL of one new POST /v1/transfers, as the server sends it",
            "-- (written by bench/pgbench_sql.py from service/store/hot_sql.py and the ledger's",
            "-- guard and writes): identify, then claim, transfer and settlement in one statement.",
            "-- Not here: HTTP, Python, the Redis lease (SET NX PX, then a compare-and-delete).",
            r"\set p random(1, :pairs)",
            r"\set src 2 * :p - 1",
            r"\set dst 2 * :p",
            r"\set k random(1, 9000000000000000000)",
            _identify(_KEY),
            settle,
            "",
        ]
    )


def replay_script() -> str:
    return "\n".join(
        [
            "-- pgbench: the SQL of one replay of POST /v1/transfers, as the server sends it",
            "-- (written by bench/pgbench_sql.py from service/store/hot_sql.py): one statement.",
            r"\set i random(1, :seeded)",
            _identify("('replay-' || :i::text)::varchar"),
            "",
        ]
    )


_SAMPLE_TRANSFER = ledger.TransferRequest(
    source=uuid.UUID(int=1), destination=uuid.UUID(int=2), amount=1, currency="EUR"
)


def write_scripts(directory: Path) -> dict[str, Path]:
    """Both scripts in ``directory``: name -> path."""
    written = {}
    for name, text in ((NEW, new_transfer_script()), (READ, replay_script())):
        path = directory / name
        path.write_text(text)
        written[name] = path
    return written
