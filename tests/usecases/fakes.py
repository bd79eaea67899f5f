"""In-memory stand-ins for what the request and attempt use cases call: the settlement store,
the tombstones, the leases and their heartbeats, the wake-ups and the late answer keeper.

Each implements only the methods those use cases call, with the same signatures, and decides
with the real core (``decide_claim``, ``settle``, ``with_lease``) so that a row moves exactly
as it would in PostgreSQL. They are for the use-case tests only: the store and the servers
are tested against real PostgreSQL and Redis elsewhere.

What a test arranges, it arranges through them: a failure for the next call of a store
method (``FakeStore.fail``), a lease taken over by another holder (``FakeLeases.steal``),
Redis unreachable (``FakeLeases.unavailable``), a settlement that wakes the waiters
(``FakeWakeups``). Nothing waits on the wall clock except what the use cases themselves bound
with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from service.core import (
    Apply,
    Claim,
    ClaimKind,
    ClaimRequest,
    Observation,
    ObservationKind,
    OperationState,
    Record,
    Scope,
    TerminalPolicy,
    decide_claim,
    settle,
    with_lease,
)
from service.domain.principals import Principal
from service.evidence import SignedEvidence
from service.leases import Lease, LeaseUnavailable
from service.leases.wakeups import Announcements
from service.store.outcomes import (
    AttemptRef,
    ClaimOutcome,
    EffectStatement,
    OperationNotFound,
    Settled,
)
from service.store.retention import Tombstone

__all__ = [
    "FakeClock",
    "FakeLate",
    "FakeLeases",
    "FakeReads",
    "FakeStore",
    "FakeTombstones",
    "FakeWakeups",
]


class FakeClock:
    """Wall-clock seconds that move only when a test moves them."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeWakeups:
    """``Prefer: wait`` wake-ups without Redis: an announcement sets the waiters' events."""

    def __init__(self) -> None:
        # the real announce-and-defer rules; only the publishing and the waits are fakes
        self._announcements = Announcements(self.publish, prefix="")
        self.announced: list[str] = []
        """operation ids announced (published), in order"""
        self.subscribable = True
        """False: a wait cannot subscribe (Redis away, too many waiters)"""
        self.waiting = asyncio.Event()
        """set when a request starts waiting for a wake-up"""
        self._waiters: dict[str, list[asyncio.Event]] = {}

    def announce(self, operation_id: str) -> None:
        self._announcements.announce(operation_id)

    def deferred(
        self, operation_id: str
    ) -> contextlib.AbstractContextManager[Callable[[], str | None]]:
        return self._announcements.deferred(operation_id)

    def publish(self, operation_id: str) -> None:
        self.announced.append(operation_id)
        for event in self._waiters.get(operation_id, []):
            event.set()

    @contextlib.asynccontextmanager
    async def wait_for(
        self, operation_id: str
    ) -> AsyncIterator[Callable[[float], Awaitable[bool]] | None]:
        if not self.subscribable:
            yield None
            return
        event = asyncio.Event()
        self._waiters.setdefault(operation_id, []).append(event)

        async def wait(seconds: float) -> bool:
            self.waiting.set()
            try:
                async with asyncio.timeout(seconds):
                    await event.wait()
            except TimeoutError:
                return False
            return True

        try:
            yield wait
        finally:
            self._waiters[operation_id].remove(event)


class FakeHeartbeat:
    """A heartbeat that never beats: its lease is lost only when a test says so."""

    def __init__(self, leases: FakeLeases, lease: Lease) -> None:
        self._leases = leases
        self.lease = lease
        self.lost = asyncio.Event()

    async def __aenter__(self) -> FakeHeartbeat:
        self._leases.beating.append(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._leases.beating.remove(self)


class FakeLeases:
    """The scope leases of Redis, in a dict; a lease's key is the name it was taken under."""

    def __init__(self, clock: FakeClock, wakeups: FakeWakeups, ttl: float = 10.0) -> None:
        self._clock = clock
        self._wakeups = wakeups
        self._ttl = ttl
        self.held: dict[str, Lease] = {}
        self.unavailable = False
        """True: every call raises LeaseUnavailable (Redis unreachable)"""
        self.acquired: list[Lease] = []
        self.released: list[tuple[Lease, str | None]] = []
        self.extended: list[Lease] = []
        self.beating: list[FakeHeartbeat] = []
        self.acquiring = asyncio.Event()
        """set on every acquire (a test waits for a request to reach its lease)"""

    @property
    def ttl(self) -> float:
        return self._ttl

    def now(self) -> float:
        return self._clock()

    def _reachable(self) -> None:
        if self.unavailable:
            raise LeaseUnavailable("the fake Redis is unreachable")

    def _live(self, name: str) -> Lease | None:
        lease = self.held.get(name)
        return lease if lease is not None and lease.expires_at > self._clock() else None

    async def acquire(self, name: str) -> Lease | None:
        self._reachable()
        self.acquiring.set()
        if self._live(name) is not None:
            return None
        lease = Lease(
            key=name, token=uuid.uuid4().hex, ttl=self._ttl, expires_at=self._clock() + self._ttl
        )
        self.held[name] = lease
        self.acquired.append(lease)
        return lease

    async def extend(self, lease: Lease) -> Lease | None:
        self._reachable()
        current = self._live(lease.key)
        if current is None or current.token != lease.token:
            return None
        renewed = dataclasses.replace(lease, expires_at=self._clock() + lease.ttl)
        self.held[lease.key] = renewed
        self.extended.append(renewed)
        return renewed

    async def release(self, lease: Lease, *, announce: str | None = None) -> bool:
        self._reachable()
        self.released.append((lease, announce))
        if announce is not None:
            self._wakeups.publish(announce)
        current = self.held.get(lease.key)
        if current is None or current.token != lease.token:
            return False
        del self.held[lease.key]
        return True

    def heartbeat(
        self,
        lease: Lease,
        *,
        on_lost: Callable[[], object] | None = None,
        before_extend: Callable[[], Awaitable[None]] | None = None,
    ) -> FakeHeartbeat:
        return FakeHeartbeat(self, lease)

    def hold(self, name: str) -> Lease:
        """Another process takes ``name``'s lease (a live attempt elsewhere)."""
        lease = Lease(
            key=name, token="another", ttl=self._ttl, expires_at=self._clock() + self._ttl
        )
        self.held[name] = lease
        return lease

    def steal(self) -> None:
        """Every lease a heartbeat keeps is taken by another holder: the heartbeats see it
        lost (as a failed extend would)."""
        for heartbeat in list(self.beating):
            self.hold(heartbeat.lease.key)
            heartbeat.lost.set()


class FakeTombstones:
    """What retention kept of purged operations, by operation id."""

    def __init__(self) -> None:
        self.stones: dict[uuid.UUID, Tombstone] = {}

    async def by_operation(
        self, operation_id: uuid.UUID, tenant: str | None = None
    ) -> Tombstone | None:
        return self.stones.get(operation_id)


class FakeLate:
    """The late answer keeper: remembers what it was handed."""

    def __init__(self) -> None:
        self.adopted: list[tuple[asyncio.Task[SignedEvidence], uuid.UUID]] = []
        self.later: list[tuple[uuid.UUID, Observation]] = []

    def adopt(
        self, call: asyncio.Task[SignedEvidence], operation_id: uuid.UUID, tenant: str | None = None
    ) -> None:
        self.adopted.append((call, operation_id))

    def settle_later(
        self, operation_id: uuid.UUID, observation: Observation, tenant: str | None = None
    ) -> None:
        self.later.append((operation_id, observation))

    async def close(self) -> None:
        for call, _ in self.adopted:
            call.cancel()
        await asyncio.gather(*(call for call, _ in self.adopted), return_exceptions=True)


class FakeStore:
    """Operation rows in a dict, moved by the real core. A local effect is its
    ``EffectStatement``, read by its effect's name: ``"apply"`` lets it through,
    ``"refuse <slug>|<detail>"`` refuses it (as the guard's SQL verdict would); its
    ``params`` are its write, kept only when its settlement applies a completed outcome, as
    its statement's would be."""

    def __init__(
        self,
        clock: FakeClock,
        wakeups: FakeWakeups,
        policy: TerminalPolicy = TerminalPolicy.CONFLICT,
    ) -> None:
        self._clock = clock
        self._wakeups = wakeups
        self._policy = policy
        self.rows: dict[str, Record] = {}
        self.scopes: dict[Scope, str] = {}
        self.principals: dict[bytes, Principal] = {}
        self.tombstones: dict[Scope, Tombstone] = {}
        self.committed: list[object] = []
        """the writes of every effect that committed (its statement's params)"""
        self.settled: list[Settled] = []
        self.claims: list[ClaimOutcome] = []
        self.fail: dict[str, BaseException] = {}
        """method name -> what its next call raises (once)"""
        self.one_statement = True
        """False: a new operation's one statement writes nothing (a row appeared, a lock was
        not granted), so the request takes the locked path"""
        self.during_effect: Callable[[], Awaitable[None]] | None = None
        """awaited while a local effect runs under the row's lock, before its outcome"""
        self.after_commit: Callable[[], Awaitable[None]] | None = None
        """awaited after a local settlement committed, before it returns"""
        self.reads = FakeReads(self, clock)
        """the rows read, as the store's ``reads``"""

    def _raise_if(self, method: str) -> None:
        _raise_once(self.fail, method)

    # -- what tests arrange -----------------------------------------------------------------

    def put(self, scope: Scope, record: Record) -> Record:
        """A row for ``scope``, as an earlier request left it."""
        self.rows[record.reservation.operation_id] = record
        self.scopes[scope] = record.reservation.operation_id
        return record

    def row(self, scope: Scope) -> Record | None:
        operation_id = self.scopes.get(scope)
        return None if operation_id is None else self.rows[operation_id]

    # -- claim ----------------------------------------------------------------------------------

    async def claim(
        self,
        scope: Scope,
        request: ClaimRequest,
        *,
        lease_token: str | None = None,
        holds_lease: bool = False,
        assume_absent: bool = False,
    ) -> ClaimOutcome:
        self._raise_if("claim")
        now = self._clock()
        record = self.row(scope)
        if record is not None and holds_lease:
            record = with_lease(record, None, now)
        decision = decide_claim(record, request, now)
        if not isinstance(decision, Claim):
            return ClaimOutcome(decision=decision, record=record)
        self.put(scope, decision.record)
        claimed = ClaimOutcome(decision=decision, record=decision.record, attempt_id=uuid.uuid4())
        self.claims.append(claimed)
        return claimed

    async def claim_and_settle_local(
        self,
        scope: Scope,
        request: ClaimRequest,
        build: Callable[[ClaimOutcome], EffectStatement],
        *,
        lease_token: str | None,
        route: str,
    ) -> tuple[ClaimOutcome, Settled] | None:
        self._raise_if("claim_and_settle_local")
        if not self.one_statement or self.row(scope) is not None:
            return None
        decision = decide_claim(None, request, self._clock())
        assert isinstance(decision, Claim) and decision.kind is ClaimKind.NEW
        claimed = ClaimOutcome(decision=decision, record=decision.record, attempt_id=uuid.uuid4())
        statement = build(claimed)
        self.put(scope, decision.record)
        self.claims.append(claimed)
        settled = self._settle(decision.record.reservation.operation_id, _outcome(statement))
        assert isinstance(settled.decision, Apply)
        self._commit(settled, statement)
        return claimed, settled

    # -- settle ---------------------------------------------------------------------------------

    def _settle(self, operation_id: str, observation: Observation) -> Settled:
        before = self.rows.get(operation_id)
        if before is None:
            raise OperationNotFound(operation_id)
        decision = settle(before, observation, self._clock(), self._policy)
        after = decision.record if isinstance(decision, Apply) else before
        self.rows[operation_id] = after
        settled = Settled(
            decision=decision,
            record=after,
            observation=observation,
            observation_id=len(self.settled) + 1,
        )
        self.settled.append(settled)
        left_progress = before.state is OperationState.IN_PROGRESS and after.state is not (
            before.state
        )
        if (after.state.terminal and not before.state.terminal) or left_progress:
            self._wakeups.announce(operation_id)
        return settled

    async def settle(
        self,
        operation_id: uuid.UUID,
        observation: Observation,
        *,
        attempt_id: uuid.UUID | None = None,
        detail: dict[str, Any] | None = None,
        tenant: str | None = None,
    ) -> Settled:
        self._raise_if("settle")
        return self._settle(str(operation_id), observation)

    async def settle_local(
        self,
        operation_id: uuid.UUID,
        attempt: AttemptRef,
        statement: EffectStatement,
        *,
        tenant: str,
        route: str,
        before_commit: Callable[[], Awaitable[None]] | None = None,
    ) -> Settled:
        """The effect runs only while ``attempt`` holds the row's current token of its epoch
        on a non-terminal row (otherwise its probe is settled, which the core ignores); its
        write commits only with an applied completed outcome."""
        self._raise_if("settle_local")
        op = str(operation_id)
        record = self.rows.get(op)
        if record is None:
            raise OperationNotFound(op)
        if (
            record.state.terminal
            or record.fencing_token != attempt.fencing_token
            or record.reservation != attempt.reservation
        ):
            return self._settle(op, attempt.probe())
        if self.during_effect is not None:
            await self.during_effect()
        if before_commit is not None:
            await before_commit()
        settled = self._settle(op, _outcome(statement))
        self._commit(settled, statement)
        if self.after_commit is not None:
            await self.after_commit()
        return settled

    def _commit(self, settled: Settled, statement: EffectStatement) -> None:
        """The effect's write, if its settlement applied a completed outcome."""
        applied = isinstance(settled.decision, Apply)
        if applied and settled.observation.kind is ObservationKind.COMPLETED:
            self.committed.append(tuple(statement.params.values()))


class FakeReads:
    """The fake store's rows read (its ``reads``): what its tests arranged there, and a
    failure arranged for the next call by method name (``FakeStore.fail``)."""

    def __init__(self, store: FakeStore, clock: FakeClock) -> None:
        self._store = store
        self._clock = clock

    async def identify(
        self, key_hash: bytes, route: str, idempotency_key: str
    ) -> tuple[Principal, Record | None, Tombstone | None] | None:
        principal = self._store.principals.get(key_hash)
        if principal is None:
            return None
        scope = Scope(
            tenant=principal.tenant,
            principal_id=principal.id,
            route=route,
            idempotency_key=idempotency_key,
        )
        stone = self._store.tombstones.get(scope)
        if stone is not None and stone.forget_at.timestamp() <= self._clock():
            stone = None  # as the schema's tombstone_stands: read only while it stands
        return principal, self._store.row(scope), stone

    async def get(self, operation_id: uuid.UUID, tenant: str | None = None) -> Record | None:
        _raise_once(self._store.fail, "get")
        return self._store.rows.get(str(operation_id))

    async def get_by_scope(self, scope: Scope) -> Record | None:
        _raise_once(self._store.fail, "get_by_scope")
        return self._store.row(scope)


def _raise_once(fail: dict[str, BaseException], method: str) -> None:
    """Raise what a test arranged for the next call of ``method``, once."""
    error = fail.pop(method, None)
    if error is not None:
        raise error


def _outcome(statement: EffectStatement) -> Observation:
    """What the effect reports: its outcome when its guard lets it through, else the refusal
    its guard names."""
    if statement.effect.name == "apply":
        return statement.observation
    verdict, _, refusal = statement.effect.name.partition(" ")
    assert verdict == "refuse", statement.effect.name
    slug, _, detail = refusal.partition("|")
    return statement.refused(slug, detail)
