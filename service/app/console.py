"""The operator console's own use cases: sign-in sessions, and the reads it shows beside the
admin API's (the feed receipts of an operation, the principals of a tenant), with what a
supersede of an operation would do. Everything it changes goes through the admin use cases
(:class:`~service.app.admin.Admin`, :class:`~service.app.feeds.FeedAdmin`)."""

from __future__ import annotations

import uuid

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.answers import Problem
from service.store.console_reads import PrincipalRow, ReceiptRow, list_principals, receipts_of
from service.store.console_sessions import ConsoleSession, ConsoleSessionStore
from service.store.principals import Principal, PrincipalStore, Role

__all__ = ["Console", "SupersedeAdvice", "supersede_advice"]

# Longest API key the sign-in form examines (keys are ~46 characters).
MAX_KEY = 400


class SupersedeAdvice(msgspec.Struct, frozen=True):
    """What a supersede of the operation as it stands would do (service.core.supersede's
    rules, read for a person)."""

    allowed: bool
    """whether the operation may be superseded at all without force"""
    needs_force: bool
    effect_may_run_again: bool
    why: str


def supersede_advice(state: str, *, external: bool, lease_live: bool) -> SupersedeAdvice:
    """The rules of :func:`service.core.supersede.decide_supersede`, first match wins."""
    if state == "completed":
        return SupersedeAdvice(
            False,
            True,
            True,
            "The operation is completed: a new epoch runs the effect again. Only force does it.",
        )
    if state == "conflict":
        return SupersedeAdvice(
            False,
            True,
            True,
            "The operation is in conflict: at least one observation says the effect happened, "
            "so a new epoch may make it happen twice. Only force does it.",
        )
    if external and state in ("unknown", "in_progress"):
        return SupersedeAdvice(
            False,
            True,
            True,
            "The external effect's outcome is unknown: the provider may have acted under the "
            "old epoch's sink key, and a new epoch sends a new one, so it may happen twice. "
            "Only force does it.",
        )
    if lease_live:
        return SupersedeAdvice(
            False,
            True,
            False,
            "An attempt holds a live lease: force fences it out (its writes will not commit).",
        )
    if state == "failed":
        return SupersedeAdvice(
            True, False, False, "The operation failed; a new epoch runs it again from scratch."
        )
    return SupersedeAdvice(
        True,
        False,
        False,
        "A local effect commits with its outcome or not at all, so nothing happened under the "
        "old epoch: a new epoch runs it once.",
    )


class Console:
    def __init__(
        self,
        engine: AsyncEngine,
        principals: PrincipalStore,
        *,
        session_lifetime: float,
    ) -> None:
        self._engine = engine
        self._principals = principals
        self._sessions = ConsoleSessionStore(engine)
        self._lifetime = session_lifetime

    async def sign_in(self, key: str) -> tuple[str, ConsoleSession] | Problem:
        """A new session for the admin holding ``key``: its id (for the cookie, once) and
        what it holds. A key that is unknown, revoked or not an admin's is refused alike."""
        refused = Problem("unauthenticated", "unknown or revoked admin API key")
        if not key or len(key) > MAX_KEY:
            return refused
        principal = await self._principals.authenticate(key)
        if principal is None or principal.role is not Role.ADMIN:
            return refused
        return await self._sessions.open(principal, key, self._lifetime)

    async def session(self, session_id: str) -> ConsoleSession | None:
        if not session_id or len(session_id) > MAX_KEY:
            return None
        return await self._sessions.find(session_id)

    async def sign_out(self, session_id: str) -> None:
        if session_id and len(session_id) <= MAX_KEY:
            await self._sessions.close(session_id)

    async def receipts(self, admin: Principal, operation_id: uuid.UUID) -> list[ReceiptRow] | None:
        """The feed receipts that touched the operation; None for a tenant admin (feeds
        span tenants: only an all-tenant admin sees them). The caller has already been
        shown the operation."""
        if not admin.all_tenants:
            return None
        return await receipts_of(self._engine, operation_id)

    async def principals(self, admin: Principal) -> list[PrincipalRow]:
        """The principals the admin manages: its tenant's, every one for an all-tenant one."""
        return await list_principals(self._engine, None if admin.all_tenants else admin.tenant)
