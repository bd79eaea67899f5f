"""What an idempotent route declares, once (the registry is :mod:`service.app.routes`): its
scope name and path, operationId, request and answer types, roles, its effect and the
problem types its effect may refuse with. The HTTP handler, the OpenAPI operation and the
client's method are derived from it.

A **local** effect is SQL (``statement``: its guard, its writes, and the :class:`Outcome` to
store when it applies) that rides in its settlement's statement, so it commits only with its
settlement (``service.store.outcomes.EffectSql``). Its guard is its one rule set: when
it refuses, it names the problem (a business failure of ``service.problem_types``) and its
detail, and that refusal is the operation's terminal ``failed`` outcome, stored and
replayed. An **external** effect sends the request downstream under the sink key and returns
verified evidence of a definitive answer, or raises ``ProviderUnavailable`` when there is none;
it reaches the provider through its :class:`ExecutionContext` (``provider``: None when this
server has none, and then the route is off, see :meth:`IdempotentRoute.unavailable`).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from service.app.answers import ProblemDocument
from service.core import ReservationTuple
from service.domain.payouts import ProviderClient
from service.domain.principals import Principal, Role
from service.evidence import SignedEvidence
from service.problem_types import problem_type
from service.store.outcomes import EffectSql

__all__ = [
    "PROBLEM_CONTENT_TYPE",
    "ExecutionContext",
    "ExternalHandler",
    "IdempotentRoute",
    "LocalStatement",
    "Outcome",
    "StatementHandler",
    "business_outcome",
    "served_at",
]

JSON = "application/json"
PROBLEM_CONTENT_TYPE = "application/problem+json"


class Outcome(msgspec.Struct, frozen=True):
    """What a handler produced: the response to store and replay."""

    status: int
    body: bytes
    content_type: str = JSON


@dataclass(frozen=True, slots=True)
class ExecutionContext:
    principal: Principal
    operation_id: uuid.UUID
    binding_generation: int
    # the downstream provider an external effect calls (None: this server has none)
    provider: ProviderClient | None = None


ExternalHandler = Callable[[ExecutionContext, ReservationTuple, Any], Awaitable[SignedEvidence]]
# a local effect as SQL (see EffectSql): its SQL, the values of its parameters, and the
# outcome when it applies
StatementHandler = Callable[
    [ExecutionContext, Any], tuple[EffectSql, Mapping[str, object], Outcome]
]


# a domain's local effect's values: (tenant, operation id, binding generation, request) ->
# (the values of its SQL's parameters, what it made: the body of the 201 when the guard lets
# it through)
DomainEffect = Callable[[str, uuid.UUID, int, Any], tuple[Mapping[str, object], Any]]


@dataclass(frozen=True, slots=True)
class LocalStatement:
    """A domain's local effect as a route's statement (a :data:`StatementHandler`): its
    answer is 201 with what it made. ``sql`` is the effect's SQL, named here only (``effect``
    gives the values of its parameters): declared on the route, the server knows its
    routes' effects before any request (``SETTLEMENT_DB_CLAIM_SETTLE=function`` creates a
    function for each at start)."""

    sql: EffectSql
    effect: DomainEffect

    def __call__(
        self, ctx: ExecutionContext, body: Any
    ) -> tuple[EffectSql, Mapping[str, object], Outcome]:
        params, made = self.effect(
            ctx.principal.tenant, ctx.operation_id, ctx.binding_generation, body
        )
        return self.sql, params, Outcome(status=201, body=msgspec.json.encode(made))


@dataclass(frozen=True, slots=True)
class IdempotentRoute:
    """Declares a route idempotent: exactly one of ``statement`` (local) or ``external``.

    ``route`` is the scope name ("POST /v1/transfers"), served at its path;
    ``operation_id`` names it in the OpenAPI document and, in snake case, the client's
    method (``createTransfer`` -> ``create_transfer``); ``body_type`` is the request body,
    ``answer_type`` the body of its success; ``refusals`` are the business failures
    (``service.problem_types``) its effect may end in, beyond those every idempotent route
    may answer."""

    route: str
    body_type: type[msgspec.Struct]
    statement: StatementHandler | None = None
    external: ExternalHandler | None = None
    roles: tuple[Role, ...] = (Role.CLIENT, Role.ADMIN)
    # seconds a terminal result stays replayable; None: SETTLEMENT_RETENTION
    retention: float | None = None
    operation_id: str = ""
    summary: str = ""
    answer_type: type[msgspec.Struct] | None = None
    refusals: tuple[str, ...] = ()

    @property
    def effect_sql(self) -> EffectSql | None:
        """A local effect's SQL as the route declares it (:class:`LocalStatement`)."""
        return self.statement.sql if isinstance(self.statement, LocalStatement) else None

    @property
    def path(self) -> str:
        """The path the route is served at (its handler's)."""
        return served_at(self.route)

    def unavailable(self, provider: ProviderClient | None) -> str | None:
        """Why the route is off on a server with ``provider`` (None: it is on): an external
        effect needs the provider."""
        if self.external is None or provider is not None:
            return None
        return (
            f"{self.route} is off on this server: no provider is configured "
            "(SETTLEMENT_PROVIDER_URL, SETTLEMENT_PROVIDER_SECRET)"
        )

    def __post_init__(self) -> None:
        if not self.route.startswith("POST /"):
            raise ValueError(f"{self.route}: an idempotent route is named 'POST /<path>'")
        if (self.statement is None) == (self.external is None):
            raise ValueError(f"{self.route}: declare exactly one of statement or external")
        if self.retention is not None and self.retention < 0:
            raise ValueError(f"{self.route}: retention must be >= 0")
        for slug in self.refusals:
            if not problem_type(slug).business:
                raise ValueError(f"{self.route}: {slug} is no business failure")


def served_at(route: str) -> str:
    """The path of an idempotent route's scope name ("POST /v1/transfers" -> "/v1/transfers"):
    its handler is served there, so the name is written once."""
    return route.removeprefix("POST ")


def business_outcome(slug: str, detail: str, operation_id: uuid.UUID) -> Outcome:
    """A business failure (a local effect's guard refused it with ``slug`` and ``detail``) as
    the problem document stored (and replayed) as its outcome."""
    failure = problem_type(slug)
    if not failure.business:
        raise ValueError(f"{slug} is no business failure (service.problem_types)")
    problem = ProblemDocument(
        type=failure.type,
        title=failure.title,
        status=failure.status,
        detail=detail,
        operation_id=str(operation_id),
        state="failed",
    )
    return Outcome(
        status=failure.status, body=msgspec.json.encode(problem), content_type=PROBLEM_CONTENT_TYPE
    )
