"""Principals and their API keys. Keys are random (256 bits) and stored only as SHA-256.

A key is looked up by its hash (unique index), then the stored hash is compared with
``hmac.compare_digest``: the lookup reveals nothing a caller could use, and the comparison
takes constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.domain.principals import Principal, Role
from service.errors import SettlementError
from service.store.db import reader
from service.store.tables import principals

__all__ = [
    "KEY_PREFIX",
    "KEY_TENANTS",
    "KeyTenants",
    "PrincipalExists",
    "PrincipalLimit",
    "PrincipalStore",
    "hash_key",
    "new_key",
]

KEY_PREFIX = "sk_"
# 32 random bytes: far past the 128 bits an API key needs against guessing.
KEY_BYTES = 32
log = logging.getLogger("settlement.principals")

# The transaction lock a capped create takes per tenant (the key of pg_advisory_xact_lock).
_LOCK = "principals-of:"

BOOTSTRAP_TENANT = "system"
BOOTSTRAP_NAME = "bootstrap-admin"


class PrincipalExists(SettlementError, ValueError):
    """The tenant has a principal of that name."""

    problem = "principal-exists"


class PrincipalLimit(SettlementError, ValueError):
    """The tenant holds as many live principals as it may: nothing was created."""

    problem = "principal-limit"

    def __init__(self, tenant: str, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} holds {limit} live principals, the most it may "
            "(SETTLEMENT_MAX_PRINCIPALS_PER_TENANT): revoke one it no longer needs first"
        )


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def _principal(row: object) -> Principal:
    return Principal(
        id=row.id,  # type: ignore[attr-defined]
        tenant=row.tenant,  # type: ignore[attr-defined]
        name=row.name,  # type: ignore[attr-defined]
        role=Role(row.role),  # type: ignore[attr-defined]
        credential_generation=row.credential_generation,  # type: ignore[attr-defined]
        all_tenants=row.all_tenants,  # type: ignore[attr-defined]
    )


def live_principal(
    row: Mapping[Any, Any] | None, digest: bytes, prefix: str = ""
) -> Principal | None:
    """The principal of a row found by ``key_hash = digest`` (columns named ``prefix`` +
    name), or None: no row, or a hash that does not match in constant time."""
    if row is None or not hmac.compare_digest(bytes(row[prefix + "key_hash"]), digest):
        return None
    return Principal(
        id=row[prefix + "id"],
        tenant=row[prefix + "tenant"],
        name=row[prefix + "name"],
        role=Role(row[prefix + "role"]),
        credential_generation=row[prefix + "credential_generation"],
        all_tenants=row[prefix + "all_tenants"],
    )


# API keys whose tenant one process remembers by default (SETTLEMENT_KEY_TENANTS): about
# 0.3 KB each, so 10,000 keys stay within a few MB
KEY_TENANTS = 10_000


class KeyTenants:
    """The tenant of each API key (by its hash) a request was authenticated with lately: at
    most ``size`` keys, the least recently used forgotten first (0: none kept).

    Safe to remember: a principal's tenant is written once, when it is created, and never
    changed (:class:`PrincipalStore` has no such write, nor has any migration), and
    ``key_hash`` is unique. The tenant is all that is kept: whether the key is still live
    (revoked, rotated out) is asked of ``principals`` by every request, in the statement the
    tenant is given to. Only keys found live are remembered (:meth:`remember`), so unknown
    keys, however many, leave nothing here; a key found dead is dropped (:meth:`forget`)."""

    __slots__ = ("_size", "_tenants")

    def __init__(self, size: int = KEY_TENANTS) -> None:
        self._size = size
        self._tenants: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tenants)

    def get(self, key_hash: bytes) -> str | None:
        tenant = self._tenants.get(key_hash)
        if tenant is not None:
            self._tenants.move_to_end(key_hash)
        return tenant

    def remember(self, key_hash: bytes, tenant: str) -> None:
        if self._size <= 0:
            return
        self._tenants[key_hash] = tenant
        self._tenants.move_to_end(key_hash)
        if len(self._tenants) > self._size:
            self._tenants.popitem(last=False)

    def forget(self, key_hash: bytes) -> None:
        self._tenants.pop(key_hash, None)


# One prepared statement on the hot path's connections: every authenticated request sends it.
_AUTHENTICATE = """
SELECT id, tenant, name, role, key_hash, credential_generation, all_tenants
  FROM principals WHERE key_hash = $1 AND revoked_at IS NULL
"""


class PrincipalStore:
    def __init__(self, engine: AsyncEngine, *, pool: Any = None) -> None:
        """``pool``: the hot path's HotPool; with it ``authenticate`` is one prepared
        statement (every authenticated request sends it)."""
        self._engine = engine
        self._reader = reader(engine)
        self._pool = pool

    async def authenticate(self, key: str) -> Principal | None:
        """The live principal holding ``key``, or None."""
        digest = hash_key(key)
        if self._pool is not None:
            async with self._pool.acquire() as conn:
                return live_principal(await conn.fetchrow(_AUTHENTICATE, digest), digest)
        async with self._reader.connect() as conn:
            found = await conn.execute(
                select(principals).where(
                    principals.c.key_hash == digest, principals.c.revoked_at.is_(None)
                )
            )
            return live_principal(found.mappings().first(), digest)

    async def create(
        self,
        tenant: str,
        name: str,
        role: Role,
        *,
        key: str | None = None,
        all_tenants: bool = False,
        limit: int | None = None,
    ) -> tuple[Principal, str]:
        """Create a principal; returns it with its API key (shown to the caller only here).
        ``limit``: the most live principals the tenant may hold (PrincipalLimit past it),
        counted under a lock of the tenant's, so concurrent creates cannot pass it together."""
        key = key or new_key()
        principal_id = uuid.uuid4()
        async with self._engine.begin() as conn:
            existing = (
                await conn.execute(
                    select(principals.c.id).where(
                        principals.c.tenant == tenant, principals.c.name == name
                    )
                )
            ).first()
            if existing is not None:
                raise PrincipalExists(f"principal {name!r} already exists in tenant {tenant!r}")
            if limit is not None:
                await conn.execute(
                    select(func.pg_advisory_xact_lock(func.hashtextextended(_LOCK + tenant, 0)))
                )
                live = (
                    await conn.execute(
                        select(func.count())
                        .select_from(principals)
                        .where(principals.c.tenant == tenant, principals.c.revoked_at.is_(None))
                    )
                ).scalar_one()
                if live >= limit:
                    raise PrincipalLimit(tenant, limit)
            try:
                await conn.execute(
                    insert(principals).values(
                        id=principal_id,
                        tenant=tenant,
                        name=name,
                        role=role.value,
                        key_hash=hash_key(key),
                        all_tenants=all_tenants,
                    )
                )
            except IntegrityError as exc:  # a concurrent create of the same (tenant, name)
                raise PrincipalExists(
                    f"principal {name!r} already exists in tenant {tenant!r}"
                ) from exc
        principal = Principal(
            id=principal_id,
            tenant=tenant,
            name=name,
            role=role,
            credential_generation=1,
            all_tenants=all_tenants,
        )
        return principal, key

    async def get(self, principal_id: uuid.UUID) -> Principal | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(select(principals).where(principals.c.id == principal_id))
            ).first()
        return None if row is None else _principal(row)

    async def rotate(self, principal_id: uuid.UUID) -> tuple[Principal, str] | None:
        """A new key and ``credential_generation + 1``; the old key stops working at once."""
        key = new_key()
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    update(principals)
                    .where(principals.c.id == principal_id, principals.c.revoked_at.is_(None))
                    .values(
                        key_hash=hash_key(key),
                        credential_generation=principals.c.credential_generation + 1,
                    )
                    .returning(*principals.c)
                )
            ).first()
        return None if row is None else (_principal(row), key)

    async def revoke(self, principal_id: uuid.UUID) -> tuple[Principal, datetime] | None:
        """Revoke a live principal: its key stops working at once. None if none is live."""
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    update(principals)
                    .where(principals.c.id == principal_id, principals.c.revoked_at.is_(None))
                    .values(revoked_at=func.now())
                    .returning(*principals.c)
                )
            ).first()
        return None if row is None else (_principal(row), row.revoked_at)

    async def ensure_bootstrap_admin(self, key: str, *, retried: bool = False) -> Principal:
        """Guarantee an all-tenant admin, made with ``key`` if there is none yet.

        An existing one is left as it is: a key rotated or revoked after a compromise stays
        rotated or revoked across restarts (the setting only seeds the first key).
        """
        async with self._engine.begin() as conn:
            row = (
                await conn.execute(
                    select(principals)
                    .where(
                        principals.c.tenant == BOOTSTRAP_TENANT,
                        principals.c.name == BOOTSTRAP_NAME,
                    )
                    .with_for_update()
                )
            ).first()
            if row is not None:
                if row.revoked_at is not None or not hmac.compare_digest(
                    bytes(row.key_hash), hash_key(key)
                ):
                    log.warning(
                        "the bootstrap admin's key was rotated or revoked: "
                        "SETTLEMENT_BOOTSTRAP_ADMIN_KEY is not its key and is not restored"
                    )
                return _principal(row)
        try:
            principal, _ = await self.create(
                BOOTSTRAP_TENANT, BOOTSTRAP_NAME, Role.ADMIN, key=key, all_tenants=True
            )
        except (PrincipalExists, IntegrityError):
            # another worker of the same server created it first: read it once more (a
            # second failure means the key is another principal's: stop, do not loop)
            if retried:
                raise
            return await self.ensure_bootstrap_admin(key, retried=True)
        return principal
