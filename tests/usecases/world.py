"""The request and attempt use cases wired as the composition root wires them, on the fakes
of :mod:`tests.usecases.fakes`, with routes of their own whose effects record what they do."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from service.app.answers import Answer, Problem, Stored
from service.app.attempt_self import attempt_observation
from service.app.attempts import Attempts
from service.app.effects import ExecutionContext, IdempotentRoute, Outcome, StatementHandler
from service.app.fingerprint import fingerprint
from service.app.requests import IdempotentRequests
from service.core import (
    Binding,
    ObservationKind,
    OperationState,
    Record,
    ReservationTuple,
    Result,
    Scope,
)
from service.domain.principals import Principal, Role
from service.evidence import (
    Evidence,
    EvidenceResult,
    SignedEvidence,
    canonical,
    content_type_for,
    result_digest,
)
from service.failpoints import Failpoints
from service.problem_types import problem_type
from service.store.outcomes import AttemptRef, EffectSql
from service.store.principals import hash_key
from service.telemetry import Metrics
from tests.usecases.fakes import (
    FakeClock,
    FakeLate,
    FakeLeases,
    FakeStore,
    FakeTombstones,
    FakeWakeups,
)

__all__ = [
    "API_KEY",
    "KEY",
    "LOCAL",
    "Gate",
    "Transfer",
    "World",
    "credit",
    "evidence_for",
    "local_route",
    "outcome_of",
    "problem",
    "refusing",
    "status_of",
]

API_KEY = "sk_test_usecases"
KEY = "key-1"


class Transfer(msgspec.Struct, frozen=True):
    amount: int


def outcome_of(body: Transfer) -> Outcome:
    return Outcome(status=201, body=msgspec.json.encode({"moved": body.amount}))


def _never_compiled(*_: object) -> Any:
    raise AssertionError("the fake store reads an effect by its name; it never compiles one")


def fake_effect(name: str) -> EffectSql:
    """An effect the fake store reads by its name: ``"apply"`` lets it through,
    ``"refuse <slug>|<detail>"`` refuses it, as the guard's SQL verdict would."""
    return EffectSql(name, guard=_never_compiled, apply=_never_compiled)


def credit(
    context: ExecutionContext, body: Transfer
) -> tuple[EffectSql, Mapping[str, object], Outcome]:
    """A local effect (its statement): a guard that lets it through, one write (its params,
    kept by the fake store only if its settlement commits), and its outcome."""
    params = {"e_operation": str(context.operation_id), "e_amount": body.amount}
    return fake_effect("apply"), params, outcome_of(body)


def refusing(slug: str, detail: str) -> StatementHandler:
    """A local effect whose guard refuses it with ``slug`` (a business failure)."""

    def refused(
        context: ExecutionContext, body: Transfer
    ) -> tuple[EffectSql, Mapping[str, object], Outcome]:
        return fake_effect(f"refuse {slug}|{detail}"), {"e_never": "written"}, outcome_of(body)

    return refused


def local_route(
    statement: StatementHandler = credit, route: str = "POST /test/local"
) -> IdempotentRoute:
    return IdempotentRoute(route=route, body_type=Transfer, statement=statement)


LOCAL = local_route()


async def _pays(context: ExecutionContext, reservation: ReservationTuple, body: Transfer) -> Any:
    return evidence_for(reservation, 201, {"paid": body.amount})


# An external route: its attempts always run under the scope's lease (a new local operation's
# one statement takes none).
EXTERNAL = IdempotentRoute(route="POST /test/leased", body_type=Transfer, external=_pays)


def evidence_for(
    reservation: ReservationTuple, status: int = 201, body: dict[str, Any] | None = None
) -> SignedEvidence:
    """A provider's definitive answer about ``reservation`` (signatures are not checked by
    the attempt: the provider client verified them)."""
    outcome: Literal["completed", "failed"] = "completed" if status < 300 else "failed"
    answer = body if body is not None else {"paid": True}
    digest = result_digest(status, content_type_for(outcome), canonical(answer))
    evidence = Evidence(
        operation_id=uuid.UUID(reservation.operation_id),
        binding_generation=reservation.binding_generation,
        request_fingerprint=reservation.request_fingerprint,
        outcome=outcome,
        result=EvidenceResult(status=status, body=answer),
        result_digest=digest,
        issued_at="2026-01-01T00:00:00Z",
    )
    return SignedEvidence(evidence=evidence, signature="0" * 64)


def status_of(answer: Answer) -> int:
    """The HTTP status the answer is rendered with."""
    if isinstance(answer, Stored):
        return answer.result.status
    return problem_type(answer.slug).status


class Gate:
    """Holds an effect until a test opens it; says when the effect reached it."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()

    async def __call__(self) -> None:
        self.reached.set()
        await self.opened.wait()


class World:
    """One process's request use case on the fakes; a principal whose API key is ``API_KEY``."""

    def __init__(
        self,
        *,
        per_principal: int = 4,
        slot_wait: float = 5.0,
        provider_timeout: float = 5.0,
        late_response_window: float = 5.0,
        failpoints: dict[str, str] | None = None,
        ttl: float = 10.0,
    ) -> None:
        self.clock = FakeClock()
        self.wakeups = FakeWakeups()
        self.leases = FakeLeases(self.clock, self.wakeups, ttl=ttl)
        self.store = FakeStore(self.clock, self.wakeups)
        self.tombstones = FakeTombstones()
        self.late = FakeLate()
        self.failpoints = Failpoints(failpoints or {})
        self.attempts = Attempts(
            store=self.store,
            leases=self.leases,
            late=self.late,
            failpoints=self.failpoints,
            provider_timeout=provider_timeout,
            late_response_window=late_response_window,
            metrics=Metrics(),
        )
        self.requests = IdempotentRequests(
            store=self.store,
            tombstones=self.tombstones,
            leases=self.leases,
            wakeups=self.wakeups,
            attempts=self.attempts,
            failpoints=self.failpoints,
            clock=self.clock,
            per_principal=per_principal,
            slot_wait=slot_wait,
        )
        self.principal = Principal(
            id=uuid.uuid4(), tenant="t1", name="client", role=Role.CLIENT, credential_generation=1
        )
        self.store.principals[hash_key(API_KEY)] = self.principal

    def scope(self, spec: IdempotentRoute, key: str = KEY) -> Scope:
        return Scope(
            tenant=self.principal.tenant,
            principal_id=self.principal.id,
            route=spec.route,
            idempotency_key=key,
        )

    async def send(
        self,
        spec: IdempotentRoute,
        body: Transfer | None = None,
        *,
        key: str = KEY,
        wait: float = 0.0,
    ) -> Answer:
        """A request as the HTTP layer makes it: identify the key's principal and scope, then
        handle the body."""
        found = await self.requests.identify(API_KEY, spec, key)
        assert found is not None
        principal, seen = found
        return await self.requests.handle(
            spec, principal, seen, body or Transfer(amount=5), wait=wait
        )

    def existing(
        self,
        spec: IdempotentRoute,
        state: str,
        *,
        body: Transfer | None = None,
        key: str = KEY,
        lease_expires_at: float | None = None,
        credential_generation: int = 1,
    ) -> Record:
        """The row an earlier request of ``body`` on ``key`` left, in ``state``."""
        row_state = OperationState(state)
        result = None
        if row_state in (OperationState.COMPLETED, OperationState.CONFLICT):
            stored = msgspec.json.encode({"moved": (body or Transfer(amount=5)).amount})
            result = Result(
                status=201,
                content_type="application/json",
                body=stored,
                digest=result_digest(201, "application/json", stored),
            )
        record = Record(
            reservation=ReservationTuple(
                operation_id=str(uuid.uuid4()),
                request_fingerprint=fingerprint(spec.route, {}, body or Transfer(amount=5)),
                binding_generation=1,
            ),
            binding=Binding(str(self.principal.id), credential_generation),
            state=row_state,
            revision=2,
            fencing_token=1,
            lease_expires_at=lease_expires_at,
            result=result,
        )
        return self.store.put(self.scope(spec, key), record)

    async def finish(self, record: Record, produced: Outcome | None = None) -> None:
        """The attempt of ``record`` (another request's) settles: ``produced``, or no outcome
        (``unknown``) when None."""
        attempt = AttemptRef(
            attempt_id=uuid.uuid4(),
            reservation=record.reservation,
            fencing_token=record.fencing_token,
        )
        kind = ObservationKind.UNKNOWN if produced is None else ObservationKind.COMPLETED
        await self.store.settle(
            uuid.UUID(record.reservation.operation_id),
            attempt_observation(attempt, kind, produced),
        )

    async def close(self) -> None:
        await self.late.close()


def problem(answer: Answer) -> Problem:
    assert isinstance(answer, Problem), answer
    return answer
