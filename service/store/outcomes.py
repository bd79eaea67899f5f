"""What the store's phases return, and the hooks it reports through."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import msgspec
from sqlalchemy import Text, cast, null, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.selectable import CTE

from service.core import (
    ClaimDecision,
    Decision,
    Observation,
    ObservationKind,
    Record,
    ReservationTuple,
    Scope,
    Source,
)
from service.errors import SettlementError

__all__ = [
    "AttemptRef",
    "ClaimOutcome",
    "EffectRefused",
    "EffectSql",
    "EffectStatement",
    "KeyExpired",
    "LeaseProbe",
    "NoHooks",
    "OperationNotFound",
    "Settled",
    "SettlementHooks",
    "SweepCursor",
    "SweepPage",
    "never_refused",
]


@dataclass(frozen=True, slots=True)
class EffectSql:
    """A local effect's SQL, built from the tables with SQLAlchemy Core; the store compiles
    each statement that carries it once (:mod:`service.store.hot_sql`).

    * ``guard()``: a CTE named ``verdict``: one row whose ``refusal`` is NULL when the
      effect may apply, else ``ARRAY[slug, detail]``, the problem that refuses it (the
      effect's rules, in one ``CASE``). The guard takes every lock the effect needs, in a
      fixed order. Its other columns are the effect's to use.
    * ``apply(written, effect_ok)``: the CTEs that write the effect, each gated on
      ``EXISTS (SELECT written.id)`` (the settlement's write of the operation row);
      ``effect_ok`` is ``verdict``'s row when the effect applies, no row when refused.
    * Every parameter of both is a named ``bindparam`` starting with ``e_``."""

    name: str
    guard: Callable[[], CTE]
    apply: Callable[[CTE, CTE], Iterable[CTE]]


def never_refused() -> CTE:
    """The guard of an effect with nothing to check: a ``verdict`` that never refuses."""
    return select(cast(null(), ARRAY(Text)).label("refusal")).cte("verdict")


@dataclass(frozen=True, slots=True)
class EffectStatement:
    """A local effect that rides in its settlement's statement, so the effect and its
    settlement commit together (:mod:`service.store.hot`).

    * ``effect``: its SQL (:class:`EffectSql`); ``params``: the values of its ``e_...``
      parameters.
    * ``observation``: what the attempt reports when the effect applies.
    * ``refused``: what the attempt reports when the guard refuses, from its slug and
      detail (a ``failed`` outcome, settled without the effect's writes)."""

    effect: EffectSql
    params: Mapping[str, object]
    observation: Observation
    refused: Callable[[str, str], Observation]


# How long each scope's lease has left in the lease store (None: nobody holds it), asked in
# one round trip; the answer reaches the core only through ``with_lease``.
LeaseProbe = Callable[[list[Scope]], Awaitable[list[float | None]]]


class OperationNotFound(SettlementError, LookupError):
    """No such operation, or not the caller's (whose existence is never revealed)."""

    problem = "not-found"


class KeyExpired(SettlementError, LookupError):
    """The scope's operation was purged by retention; its tombstone still stands."""

    problem = "idempotency-key-expired"

    def __init__(self, operation_id: uuid.UUID) -> None:
        super().__init__(f"operation {operation_id} expired; its key cannot be used again yet")
        self.operation_id = operation_id


class EffectRefused(SettlementError, RuntimeError):
    """The database refused a local effect's writes (a CHECK, unique, foreign-key, not-null
    or exclusion constraint): its statement rolled back, nothing of it was written."""

    problem = "effect-refused"

    def __init__(self, constraint: str) -> None:
        super().__init__(f"the database refused the effect's writes ({constraint})")
        self.constraint = constraint


class Settled(msgspec.Struct, frozen=True):
    """The decision, the authoritative record after it, and the observation that was settled."""

    decision: Decision
    record: Record
    observation: Observation
    observation_id: int


SweepCursor = tuple[datetime, uuid.UUID]


class SweepPage(msgspec.Struct, frozen=True):
    """What one sweep demoted, and where the next page starts (None: start over)."""

    demoted: list[uuid.UUID]
    next: SweepCursor | None


class AttemptRef(msgspec.Struct, frozen=True):
    """What an attempt knows about itself: its row, its reservation and its fencing token."""

    attempt_id: uuid.UUID
    reservation: ReservationTuple
    fencing_token: int

    def probe(self) -> Observation:
        """``unknown`` under this attempt's token: what a fenced-out or late attempt settles
        instead of its effect (the core ignores it; the observation row keeps it)."""
        return Observation(
            reservation=self.reservation,
            kind=ObservationKind.UNKNOWN,
            source=Source.ATTEMPT,
            fencing_token=self.fencing_token,
        )


class ClaimOutcome(msgspec.Struct, frozen=True):
    decision: ClaimDecision
    record: Record | None
    attempt_id: uuid.UUID | None = None


class SettlementHooks(Protocol):
    """What the store reports as it settles (metrics live behind this)."""

    def on_settled(
        self, source: str, stage: str, disposition: str, seconds: float | None = None
    ) -> None:
        """An observation of ``source`` was settled: the merge ``stage`` (A, B, C) that
        decided it and its ``disposition``; ``seconds``: how long its settlement took."""

    def on_claimed(self, kind: str) -> None: ...

    def on_stale_epoch_outcome(self) -> None: ...

    def on_progress_ended(self, operation_id: str, terminal: bool) -> None:
        """``operation_id`` became terminal, or its attempt ended without an outcome (the
        row left ``in_progress``), and that is committed: ``Prefer: wait`` wakes."""


class NoHooks:
    def on_stale_epoch_outcome(self) -> None:
        return None

    def on_settled(
        self, source: str, stage: str, disposition: str, seconds: float | None = None
    ) -> None:
        return None

    def on_claimed(self, kind: str) -> None:
        return None

    def on_progress_ended(self, operation_id: str, terminal: bool) -> None:
        return None
