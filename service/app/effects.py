"""What an idempotent route declares: its scope name, body schema, roles and its effect.

A **local** effect writes its rows on the settlement transaction's connection and returns the
:class:`Outcome` to store; it commits only with its settlement. An **external** effect sends
the request downstream under the sink key and returns verified evidence of a definitive
answer, or raises ``ProviderUnavailable`` when there is none. A handler that raises
``BusinessFailure`` has a terminal ``failed`` outcome, stored and replayed.

A local route may also declare its effect as SQL (``statement``): then the effect and its
settlement are tried first as one statement (one round trip, no BEGIN or COMMIT), and
``execute`` runs only when that statement's guard refuses (to explain the refusal) or the
operation's row moved on. Both must do the same thing.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec

from service.app.answers import ProblemDocument
from service.core import ReservationTuple
from service.domain.ledger import BusinessFailure
from service.evidence import SignedEvidence
from service.store.principals import Principal, Role

__all__ = [
    "PROBLEM_CONTENT_TYPE",
    "ExecutionContext",
    "ExternalHandler",
    "IdempotentRoute",
    "LocalHandler",
    "Outcome",
    "StatementHandler",
    "business_outcome",
]

JSON = "application/json"
PROBLEM_CONTENT_TYPE = "application/problem+json"

# Business failures a route may store as terminal outcomes: (status, title).
BUSINESS_FAILURES: dict[str, tuple[int, str]] = {
    "insufficient-funds": (402, "Insufficient funds"),
    "account-not-found": (404, "Account not found"),
    "currency-mismatch": (422, "Currency mismatch"),
    "balance-limit": (422, "Balance limit exceeded"),
    "payout-declined": (402, "Payout declined"),
}


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


LocalHandler = Callable[[asyncpg.Connection, ExecutionContext, Any], Awaitable[Outcome]]
ExternalHandler = Callable[[ExecutionContext, ReservationTuple, Any], Awaitable[SignedEvidence]]
# ``execute``'s effect as SQL (see EffectStatement): the guard's and writes' common table
# expressions, their ``$E<n>`` values, and the outcome when it applies
StatementHandler = Callable[[ExecutionContext, Any], tuple[str, str, tuple[object, ...], Outcome]]


@dataclass(frozen=True, slots=True)
class IdempotentRoute:
    """Declares a route idempotent: exactly one of ``execute`` (local) or ``external``."""

    route: str
    body_type: type[msgspec.Struct]
    execute: LocalHandler | None = None
    external: ExternalHandler | None = None
    # execute's effect as one statement with its settlement (optional; local routes only)
    statement: StatementHandler | None = None
    roles: tuple[Role, ...] = (Role.CLIENT, Role.ADMIN)
    # seconds a terminal result stays replayable; None: SETTLEMENT_RETENTION
    retention: float | None = None

    def __post_init__(self) -> None:
        if (self.execute is None) == (self.external is None):
            raise ValueError(f"{self.route}: declare exactly one of execute or external")
        if self.statement is not None and self.execute is None:
            raise ValueError(f"{self.route}: a statement form needs execute")
        if self.retention is not None and self.retention < 0:
            raise ValueError(f"{self.route}: retention must be >= 0")


def business_outcome(failure: BusinessFailure, operation_id: uuid.UUID) -> Outcome:
    """A business failure as the problem document stored (and replayed) as its outcome."""
    status, title = BUSINESS_FAILURES[failure.slug]
    problem = ProblemDocument(
        type=f"/problems/{failure.slug}",
        title=title,
        status=status,
        detail=failure.detail,
        operation_id=str(operation_id),
        state="failed",
    )
    return Outcome(
        status=status, body=msgspec.json.encode(problem), content_type=PROBLEM_CONTENT_TYPE
    )
