"""Console sessions: an admin API key exchanged for a server-side session.

A session is found by the SHA-256 of its random id (the id itself lives only in the
operator's cookie), then the stored hash is compared in constant time, as API keys are. A
session is live while it has not expired, its principal is not revoked and the principal's
key is still the one it signed in with: ``key_fingerprint`` is the SHA-256 of the principal's
``key_hash`` at sign-in, compared in the same statement, so a rotation or a revocation ends
every session of that key at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

import msgspec
from sqlalchemy import delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from service.domain.principals import Principal, Role
from service.store.principals import hash_key
from service.store.tables import console_sessions, principals

__all__ = ["ConsoleSession", "ConsoleSessionStore", "hash_session"]

# 32 random bytes: the session id and the form token are as hard to guess as an API key.
TOKEN_BYTES = 32


class ConsoleSession(msgspec.Struct, frozen=True):
    principal: Principal
    csrf_token: str
    expires_at: datetime


def hash_session(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).digest()


def _fingerprint(key_hash: bytes) -> bytes:
    return hashlib.sha256(key_hash).digest()


class ConsoleSessionStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def open(
        self, principal: Principal, key: str, lifetime: float
    ) -> tuple[str, ConsoleSession]:
        """A new session of ``principal``, signed in with ``key``: its random id (given to
        the operator once, stored only hashed) and what it holds. Expired sessions of every
        principal are deleted in the same transaction."""
        session_id = secrets.token_urlsafe(TOKEN_BYTES)
        csrf = secrets.token_urlsafe(TOKEN_BYTES)
        async with self._engine.begin() as conn:
            await conn.execute(
                delete(console_sessions).where(console_sessions.c.expires_at <= func.now())
            )
            expires_at = (
                await conn.execute(
                    insert(console_sessions)
                    .values(
                        id_hash=hash_session(session_id),
                        principal_id=principal.id,
                        key_fingerprint=_fingerprint(hash_key(key)),
                        csrf_token=csrf,
                        expires_at=func.now() + timedelta(seconds=lifetime),
                    )
                    .returning(console_sessions.c.expires_at)
                )
            ).scalar_one()
        return session_id, ConsoleSession(principal, csrf, expires_at)

    async def find(self, session_id: str) -> ConsoleSession | None:
        """The live session of ``session_id``, or None (unknown, expired, or its key rotated
        or revoked)."""
        digest = hash_session(session_id)
        stmt = (
            select(
                console_sessions.c.id_hash,
                console_sessions.c.csrf_token,
                console_sessions.c.expires_at,
                principals,
            )
            .join(principals, principals.c.id == console_sessions.c.principal_id)
            .where(
                console_sessions.c.id_hash == digest,
                console_sessions.c.expires_at > func.now(),
                principals.c.revoked_at.is_(None),
                func.sha256(principals.c.key_hash) == console_sessions.c.key_fingerprint,
            )
        )
        async with self._engine.connect() as conn:
            row = (await conn.execute(stmt)).first()
        if row is None or not hmac.compare_digest(bytes(row.id_hash), digest):
            return None
        principal = Principal(
            id=row.id,
            tenant=row.tenant,
            name=row.name,
            role=Role(row.role),
            credential_generation=row.credential_generation,
            all_tenants=row.all_tenants,
        )
        return ConsoleSession(principal, row.csrf_token, row.expires_at)

    async def close(self, session_id: str) -> None:
        async with self._engine.begin() as conn:
            await conn.execute(
                delete(console_sessions).where(
                    console_sessions.c.id_hash == hash_session(session_id)
                )
            )
