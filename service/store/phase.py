"""The one atomic-phase runner: lock -> core decision -> CAS -> record, in one transaction.

Every authoritative write (claim, settle, local settle, supersede, sweep) is a *phase*: an
async function that, on a :class:`UnitOfWork`, locks its row(s) with ``get_for_update``,
asks the pure core, writes with the tuple + revision CAS and records what was decided. The
runner gives all of them the same two rules:

* a refused CAS (:class:`StaleRevision`) rolls the transaction back and reruns the whole
  phase on a fresh read, at most ``max_retries`` times, then gives up with
  :class:`SettlementContention` (503): never assign blindly;
* a row lock not granted within the lock timeout is :class:`RowLocked` (409), not a fault.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import asyncpg
from sqlalchemy.exc import DBAPIError

from service.errors import SettlementError
from service.store.outcomes import EffectRefused, KeyExpired
from service.store.unit_of_work import StaleRevision, UnitOfWork

__all__ = ["Phase", "PhaseRunner", "RowLocked", "SettlementContention"]

log = logging.getLogger("settlement.store")

T = TypeVar("T")
Phase = Callable[[UnitOfWork], Awaitable[T]]

# SQLSTATE of "lock_timeout expired" (lock_not_available).
LOCK_NOT_AVAILABLE = "55P03"
# SQLSTATE of the schema's own refusal to insert an operation under a live tombstone (the
# trigger of migration 0006); its DETAIL is the purged operation's id.
KEY_EXPIRED = "SK410"


class RowLocked(SettlementError, RuntimeError):
    """A row stayed locked past the lock timeout (another phase holds it)."""

    problem = "operation-in-progress"


class SettlementContention(SettlementError, RuntimeError):
    """The revision kept moving for ``max_retries`` rounds."""

    problem = "service-unavailable"


@contextlib.contextmanager
def database_refusals() -> Iterator[None]:
    """A lock not granted within the lock timeout is a busy row, not a server fault; an
    insert under a live tombstone is the key's expiry (:class:`KeyExpired`). On the hot
    path's statements also: a deadlock PostgreSQL broke is a busy row (:class:`RowLocked`), a
    constraint refusing a local effect's writes is :class:`EffectRefused`."""
    try:
        yield
    except DBAPIError as exc:  # a statement sent through SQLAlchemy
        if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            raise RowLocked("the operation row is locked by another phase") from exc
        cause = exc.orig.__cause__ if exc.orig is not None else None
        if isinstance(cause, asyncpg.PostgresError) and cause.sqlstate == KEY_EXPIRED:
            raise _expired(cause) from exc
        raise
    except asyncpg.PostgresError as exc:  # the hot path's statements, on asyncpg
        if exc.sqlstate == LOCK_NOT_AVAILABLE:
            raise RowLocked("a row is locked by another phase") from exc
        if exc.sqlstate == KEY_EXPIRED:
            raise _expired(exc) from exc
        if isinstance(exc, asyncpg.DeadlockDetectedError):
            raise RowLocked("PostgreSQL broke a deadlock by aborting this transaction") from exc
        if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
            constraint = getattr(exc, "constraint_name", None) or type(exc).__name__
            raise EffectRefused(constraint) from exc
        raise


def _expired(exc: asyncpg.PostgresError) -> KeyExpired:
    """The trigger's DETAIL is the purged operation's id."""
    return KeyExpired(uuid.UUID(str(exc.detail)))


class PhaseRunner:
    def __init__(self, unit_of_work: Callable[[], UnitOfWork], *, max_retries: int) -> None:
        self._unit_of_work = unit_of_work
        self._max_retries = max_retries

    async def run(
        self,
        what: str,
        phase: Phase[T],
        *,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> T:
        """Run ``phase`` in its own transaction and commit it; rerun it on a stale CAS."""
        with database_refusals():
            for round_ in range(1, self._max_retries + 1):
                async with self._unit_of_work() as uow:
                    try:
                        result = await phase(uow)
                    except StaleRevision:
                        log.warning(
                            "CAS refused, rerunning the phase",
                            extra={"phase": what, "round": round_},
                        )
                        continue
                    if before_commit is not None:
                        await before_commit()
                    await uow.commit()
                    return result
        raise SettlementContention(f"{what}: revision kept moving")
