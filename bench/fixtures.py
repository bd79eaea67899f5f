"""Data every scenario starts from: one client principal and funded accounts.

Accounts get predictable ids (``account_id(i)``), so the Lua scripts and the pgbench scripts
pick the same account pairs without sharing a list: pair ``p`` (1-based) moves money from
account ``2p - 1`` to account ``2p``. Pairs are disjoint, and there are many of them, so
concurrent transfers rarely wait on each other's account locks: the scenarios measure the
request path, not lock queues on two hot rows.

``create`` makes them and returns a ``Fixture``: the client's key, and the arguments and raw
requests the load generators send with it.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass, field

import asyncpg

from bench.loadgen import raw_request

__all__ = [
    "ACCOUNT_PREFIX",
    "BALANCE",
    "CURRENCY",
    "PAIRS",
    "ROUTE",
    "TENANT",
    "TRANSFERS",
    "Fixture",
    "account_id",
    "create",
    "create_accounts",
    "create_client",
    "pair",
]

TENANT = "bench"
CURRENCY = "EUR"
# Disjoint (source, destination) pairs the transfers spread over.
PAIRS = 100
# Enough for every transfer of a long run at amount 1: no 402 ever.
BALANCE = 10**12
# account i is ACCOUNT_PREFIX + i as 12 zero-padded digits (a valid version-4 UUID)
ACCOUNT_PREFIX = "00000000-0000-4000-8000-"
TRANSFERS = "/v1/transfers"
ROUTE = "POST /v1/transfers"


def account_id(i: int) -> uuid.UUID:
    return uuid.UUID(f"{ACCOUNT_PREFIX}{i:012d}")


def pair(p: int) -> tuple[uuid.UUID, uuid.UUID]:
    """Pair ``p`` in 1..PAIRS: (source, destination)."""
    return account_id(2 * p - 1), account_id(2 * p)


async def create_client(database_url: str) -> tuple[uuid.UUID, str]:
    """A client principal of TENANT; its id and API key."""
    from service.config import Settings
    from service.domain.principals import Role
    from service.store.db import make_engine
    from service.store.principals import PrincipalStore

    engine = make_engine(Settings(), database_url, pool_size=1)
    try:
        principal, key = await PrincipalStore(engine).create(TENANT, "bench-client", Role.CLIENT)
    finally:
        await engine.dispose()
    return principal.id, key


async def create_accounts(database_url: str) -> None:
    """2 x PAIRS funded accounts of TENANT (written directly: setup, not measured)."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO accounts (id, tenant, currency, balance) "
            f"SELECT ('{ACCOUNT_PREFIX}' || lpad(i::text, 12, '0'))::uuid, $1, $2, $3 "
            "FROM generate_series(1, $4::int) AS i",
            TENANT,
            CURRENCY,
            BALANCE,
            2 * PAIRS,
        )
    finally:
        await conn.close()


@dataclass
class Fixture:
    """The bench client of one run, and the replay keys seeded for it."""

    principal_id: str
    api_key: str
    key_hash: str
    # part of every fresh key: one run's keys never meet another's
    run_token: str = field(default_factory=lambda: secrets.token_hex(3))
    seed_requests: list[bytes] = field(default_factory=list)
    operation_ids: list[str] = field(default_factory=list)

    def fresh_args(self, path: str, tag: str) -> list[str]:
        """The arguments of ``fresh.lua``: a new transfer to ``path`` per request."""
        return [path, self.api_key, str(PAIRS), ACCOUNT_PREFIX, f"{tag}-{self.run_token}"]

    def transfer_request(
        self, port: int, key: str, pair_no: int, path: str = TRANSFERS, amount: int = 1
    ) -> bytes:
        """A raw ``POST /v1/transfers`` (or to ``path``) of ``amount`` from pair ``pair_no``,
        under ``key``."""
        source, destination = pair(pair_no)
        body = json.dumps(
            {
                "source": str(source),
                "destination": str(destination),
                "amount": amount,
                "currency": CURRENCY,
            },
            separators=(",", ":"),
        ).encode()
        headers = {"Authorization": f"Bearer {self.api_key}", "Idempotency-Key": key}
        return raw_request("POST", path, port, headers, body)

    def seed_transfers(self, port: int, path: str, prefix: str, n: int) -> list[bytes]:
        """``n`` transfers to ``path`` with keys ``<prefix>-1`` .. ``<prefix>-<n>``, the pairs
        in turn: the completed keys a replay scenario cycles through."""
        return [
            self.transfer_request(port, f"{prefix}-{i}", (i - 1) % PAIRS + 1, path)
            for i in range(1, n + 1)
        ]


async def create(database_url: str) -> Fixture:
    """The client principal and the funded accounts (setup, not measured)."""
    from service.store.principals import hash_key

    principal_id, api_key = await create_client(database_url)
    await create_accounts(database_url)
    return Fixture(str(principal_id), api_key, hash_key(api_key).hex())
