"""The ports of the request and attempt use cases: what they call of the settlement store,
the tombstones, the leases, the wake-ups and the late answer keeper, as ``typing.Protocol``s.

The use cases take these, never the concrete classes, so anything with the same methods
stands in: the composition root passes the real ones (``SettlementStore``, whose ``reads``
is a ``SettlementReads``, ``RetentionStore``, ``LeaseManager``, ``Wakeups``, ``LateAnswers``),
the use-case tests their in-memory fakes, and mypy checks both against the same declaration.
Each port holds only what a use case calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol

from service.core import ClaimRequest, Observation, Record, Scope
from service.domain.principals import Principal
from service.evidence import SignedEvidence
from service.leases import Lease
from service.store.outcomes import AttemptRef, ClaimOutcome, EffectStatement, Settled
from service.store.retention import Tombstone

__all__ = [
    "HeartbeatPort",
    "LatePort",
    "LeasePort",
    "OperationReadPort",
    "PrincipalKeys",
    "SettlementPort",
    "TombstonePort",
    "WakeupPort",
]


class OperationReadPort(Protocol):
    """The operations' rows read, one statement each: the request's first read, re-reads."""

    async def identify(
        self, key_hash: bytes, route: str, idempotency_key: str
    ) -> tuple[Principal, Record | None, Tombstone | None] | None: ...

    async def get(self, operation_id: uuid.UUID) -> Record | None: ...

    async def get_by_scope(self, scope: Scope) -> Record | None: ...


class SettlementPort(Protocol):
    """The operations' rows: their reads, the claim and the settlements."""

    @property
    def reads(self) -> OperationReadPort: ...

    async def claim(
        self,
        scope: Scope,
        request: ClaimRequest,
        *,
        lease_token: str | None = None,
        holds_lease: bool = False,
        assume_absent: bool = False,
    ) -> ClaimOutcome: ...

    async def claim_and_settle_local(
        self,
        scope: Scope,
        request: ClaimRequest,
        build: Callable[[ClaimOutcome], EffectStatement],
        *,
        lease_token: str | None,
        route: str,
    ) -> tuple[ClaimOutcome, Settled] | None: ...

    async def settle(
        self,
        operation_id: uuid.UUID,
        observation: Observation,
        *,
        attempt_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
        tenant: str | None = None,
    ) -> Settled: ...

    async def settle_local(
        self,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        statement: EffectStatement,
        *,
        tenant: str,
        route: str,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> Settled: ...


class TombstonePort(Protocol):
    """What retention kept of a purged operation."""

    async def by_operation(self, operation_id: uuid.UUID) -> Tombstone | None: ...


class HeartbeatPort(Protocol):
    """Keeps a lease while its ``async with`` body runs; ``lost`` is set when it could not."""

    @property
    def lost(self) -> asyncio.Event: ...

    @property
    def lease(self) -> Lease: ...

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...


class LeasePort(Protocol):
    """The scopes' leases (liveness, never authority)."""

    @property
    def ttl(self) -> float: ...

    def now(self) -> float: ...

    async def acquire(self, name: str) -> Lease | None: ...

    async def extend(self, lease: Lease) -> Lease | None: ...

    async def release(self, lease: Lease, *, announce: str | None = None) -> bool: ...

    def heartbeat(
        self,
        lease: Lease,
        *,
        on_lost: Callable[[], object] | None = None,
        before_extend: Callable[[], Awaitable[None]] | None = None,
    ) -> HeartbeatPort: ...


class WakeupPort(Protocol):
    """``Prefer: wait``'s wake-ups: announcements held while an attempt runs, and waits."""

    def deferred(
        self, operation_id: str
    ) -> contextlib.AbstractContextManager[Callable[[], str | None]]: ...

    def wait_for(
        self, operation_id: str
    ) -> contextlib.AbstractAsyncContextManager[Callable[[float], Awaitable[bool]] | None]: ...


class LatePort(Protocol):
    """The late answer keeper: provider calls that outlived their attempt."""

    def adopt(
        self, call: asyncio.Task[SignedEvidence], operation_id: uuid.UUID, tenant: str | None = None
    ) -> None: ...

    def settle_later(
        self, operation_id: uuid.UUID, observation: Observation, tenant: str | None = None
    ) -> None: ...


class PrincipalKeys(Protocol):
    """Who holds an API key: HTTP's authentication."""

    async def authenticate(self, key: str) -> Principal | None: ...
