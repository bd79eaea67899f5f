"""pgbench scripts of the server's own SQL, written at run time from the statements the
server sends (:mod:`service.store.hot_sql` with the ledger's guard and writes), so the
``pgbench-new`` and ``pgbench-read`` rows measure today's statements, never a copy that went
stale. Each ``$n`` of a statement becomes a pgbench expression of the script's variables
(``-D``: key_hash, tenant, principal, pairs, seeded); run with ``-M prepared``, as asyncpg
prepares every statement.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from pathlib import Path

from service.domain import ledger
from service.store.hot_sql import CLAIM_SETTLE_PARAMS, IDENTIFY, claim_settle_with

__all__ = ["NEW", "READ", "write_scripts"]

NEW = "new.sql"
READ = "read.sql"

ROUTE = "'POST /v1/transfers'::varchar"
_PLACEHOLDER = re.compile(r"\$([1-9][0-9]*)")


def _account(variable: str) -> str:
    """The bench fixture's account number ``variable`` (bench.fixtures: 1..2*pairs)."""
    return f"('00000000-0000-4000-8000-' || lpad(:{variable}::text, 12, '0'))::uuid"


def _bound(sql: str, values: Sequence[str]) -> str:
    """``sql`` with each ``$n`` replaced by ``values[n - 1]`` (parenthesized)."""
    used = {int(n) for n in _PLACEHOLDER.findall(sql)}
    if used != set(range(1, len(values) + 1)):
        raise ValueError(f"the statement takes {len(used)} values, the script {len(values)}")
    return _PLACEHOLDER.sub(lambda m: f"({values[int(m[1]) - 1]})", sql).strip() + ";"


_OPERATION = "md5('op' || :k::text)::uuid"
_ATTEMPT = "md5('at' || :k::text)::uuid"
_KEY = "('pgbench-' || :k::text)::varchar"
_FINGERPRINT = "(md5(:k::text) || md5(:k::text))::varchar"

# CLAIM_SETTLE_PARAMS values of the one statement of a new transfer, in service/store/hot.py's
# order (service/store/hot_args.py): the row as the core settles a completed transfer, its
# attempt begun and ended, its observation
_SETTLED_ROW = [
    _OPERATION,  # $1 id
    ":tenant::varchar",  # $2
    ":principal::uuid",  # $3
    ROUTE,  # $4
    _KEY,  # $5
    "1::int",  # $6 binding generation
    _FINGERPRINT,  # $7
    ":principal::uuid",  # $8 bound principal
    "1::int",  # $9 bound credential generation
    "'completed'::varchar",  # $10 state
    "2::bigint",  # $11 revision after the claim and the settlement
    "1::bigint",  # $12 fencing token
    _ATTEMPT,  # $13 attempt
    "NULL::timestamptz",  # $14 lease (none once settled)
    "now()",  # $15 now
    "201::int",  # $16 result status
    "'application/json'::varchar",  # $17
    "decode(repeat('7b', 229), 'hex')",  # $18 a transfer's answer is about 229 bytes
    _FINGERPRINT,  # $19 result digest (64 hex characters)
    "NULL::jsonb",  # $20 conflict
    "now() + interval '1 day'",  # $21 expires_at
    "md5(:k::text)::varchar",  # $22 lease token
    "now() + interval '10 seconds'",  # $23 claim-time lease
    "'attempt'::varchar",  # $24 observation source
    "'completed'::varchar",  # $25 kind
    "1::int",  # $26 binding generation
    _FINGERPRINT,  # $27
    "1::bigint",  # $28 fencing token
    "true",  # $29 verified
    "201::int",  # $30 result status
    _FINGERPRINT,  # $31 result digest
    "NULL::timestamptz",  # $32 lease
    "'C'::varchar",  # $33 stage
    "'applied'::varchar",  # $34 disposition
    "'terminal-applied'::varchar",  # $35 reason
    "1::bigint",  # $36 revision before
    "1::bigint",  # $37 the attempt's fencing token
    "1::int",  # $38 its epoch
]
# ledger.transfer_statement's $E1-$E12: one unit from account 2p-1 to account 2p, in EUR
_TRANSFER = [
    f"ARRAY[{_account('src')}, {_account('dst')}]",  # $E1 both, in id order
    ":tenant::varchar",  # $E2
    _account("src"),  # $E3
    _account("dst"),  # $E4
    "1::bigint",  # $E5 amount
    "'EUR'::varchar",  # $E6
    f"{ledger.MAX_AMOUNT}::bigint",  # $E7 the balance limit
    "gen_random_uuid()",  # $E8 the transfer's id
    _OPERATION,  # $E9
    "1::int",  # $E10 binding generation
    "NULL::varchar",  # $E11 memo
    "now()",  # $E12
]


def _identify(key: str) -> str:
    """The principal and its scope's row: the first statement of every request."""
    return _bound(IDENTIFY, ["decode(:key_hash, 'hex')", ROUTE, key])


def new_transfer_script() -> str:
    guard, apply, args, _ = ledger.transfer_statement("t", uuid.uuid4(), 1, _SAMPLE_TRANSFER)
    if len(_SETTLED_ROW) != CLAIM_SETTLE_PARAMS or len(args) != len(_TRANSFER):
        raise ValueError("bench/pgbench_sql.py no longer gives the statement's parameters")
    settle = _bound(claim_settle_with(guard, apply), [*_SETTLED_ROW, *_TRANSFER])
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
