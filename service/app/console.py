"""The operator console's own use cases: sign-in sessions, and the reads it shows beside the
admin API's (the feed receipts of an operation, the principals of a tenant), with what a
supersede of an operation would do. Everything it changes goes through the admin use cases
(:class:`~service.app.admin.Admin`, :class:`~service.app.feeds.FeedAdmin`)."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app.admin import Tenant
from service.app.answers import Problem
from service.domain.principals import Principal, Role
from service.store.console_reads import (
    BadPrincipalCursor,
    PrincipalPage,
    ReceiptRow,
    list_principals,
    receipts_of,
)
from service.store.console_sessions import ConsoleSession, ConsoleSessionStore
from service.store.principals import PrincipalStore

# ConsoleSession and ReceiptRow: what the console's pages render, named where HTTP reaches them
__all__ = [
    "Console",
    "ConsoleSession",
    "ReceiptRow",
    "SignInThrottle",
    "SupersedeAdvice",
    "supersede_advice",
]

log = logging.getLogger("settlement.console")

# Longest API key the sign-in form examines (keys are ~46 characters).
MAX_KEY = 400
# Principals per page of the console's list (a page must stay quick to read and render).
PRINCIPALS_PAGE = 100
# Client addresses one sign-in window keeps counts for; past it a new address is let through
# uncounted (and logged once a window), so a flood of addresses cannot grow the table without
# bound, and no per-address count could stop so many addresses anyway.
MAX_TRACKED_ADDRESSES = 10_000


class SignInThrottle:
    """Console sign-ins per client address, in fixed windows: at most ``attempts`` that did
    not succeed per ``window`` seconds; more are refused until the window ends.

    Counted in this process, not in Redis, on purpose: the console is what an operator
    reaches for in an incident, a Redis outage among them, so a sign-in never waits on Redis
    nor fails because of it. The price: a server of N workers lets N times ``attempts``
    through per window. That is enough for what the limit is for (a 256-bit key cannot be
    guessed at any rate; the limit keeps an address from trying keys by the hundred and
    costing CPU doing it). An attempt is counted when it starts (so concurrent ones cannot
    slip past the count) and given back when it succeeds."""

    def __init__(
        self, attempts: int, window: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._attempts = attempts
        self._window = window
        self._clock = clock
        self._current = -1  # the window the counts belong to
        self._counts: dict[str, int] = {}
        self._full_logged = False

    def take(self, address: str) -> float | None:
        """Count an attempt from ``address``: None if it may go on, else the seconds until
        its window ends (it is refused; nothing is counted)."""
        now = self._clock()
        current = math.floor(now / self._window)
        if current != self._current:
            self._current, self._counts, self._full_logged = current, {}, False
        count = self._counts.get(address, 0)
        if count >= self._attempts:
            return max(1.0, (current + 1) * self._window - now)
        if count == 0 and len(self._counts) >= MAX_TRACKED_ADDRESSES:
            if not self._full_logged:
                self._full_logged = True
                log.warning("console sign-ins from too many addresses to count this window")
            return None
        self._counts[address] = count + 1
        return None

    def give_back(self, address: str) -> None:
        """A successful sign-in: its attempt does not count."""
        count = self._counts.get(address, 0)
        if count > 1:
            self._counts[address] = count - 1
        elif count == 1:
            del self._counts[address]


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
        sign_in_attempts: int,
        sign_in_window: float,
    ) -> None:
        self._engine = engine
        self._principals = principals
        self._sessions = ConsoleSessionStore(engine)
        self._lifetime = session_lifetime
        self._throttle = SignInThrottle(sign_in_attempts, sign_in_window)

    def admit(self, address: str) -> float | None:
        """A sign-in attempt from ``address`` begins: None if it may go on, else how many
        seconds until it may (it is refused before its form is read)."""
        return self._throttle.take(address)

    async def sign_in(self, key: str, address: str) -> tuple[str, ConsoleSession] | Problem:
        """A new session for the admin holding ``key``: its id (for the cookie, once) and
        what it holds. A key that is unknown, revoked or not an admin's is refused alike.
        A success gives back the attempt :meth:`admit` counted for ``address``."""
        refused = Problem("unauthenticated", "unknown or revoked admin API key")
        if not key or len(key) > MAX_KEY:
            return refused
        principal = await self._principals.authenticate(key)
        if principal is None or principal.role is not Role.ADMIN:
            return refused
        opened = await self._sessions.open(principal, key, self._lifetime)
        self._throttle.give_back(address)
        return opened

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

    async def principals(
        self, admin: Principal, tenant: str | None = None, before: str | None = None
    ) -> PrincipalPage | Problem:
        """A page of the principals the admin manages, newest first, after the cursor
        ``before``: of ``tenant``, or with none of every tenant for an all-tenant admin
        (a tenant admin: of its own tenant only, another is forbidden)."""
        if tenant is not None:
            try:
                tenant = msgspec.convert(tenant, Tenant)
            except msgspec.ValidationError as exc:
                return Problem("validation-error", f"tenant: {exc}")
            if not admin.may_act_in(tenant):
                return Problem("forbidden", f"this admin may not act in tenant {tenant!r}")
        elif not admin.all_tenants:
            tenant = admin.tenant
        try:
            return await list_principals(self._engine, tenant, PRINCIPALS_PAGE, before)
        except BadPrincipalCursor as exc:
            return Problem("validation-error", str(exc))
