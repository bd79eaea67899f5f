"""What the settlement store tells after a commit: the hooks (metrics, wake-ups) and the log.

A settlement reports its decision (logged at a level by how newsworthy it is), a row that
left ``in_progress`` or became terminal (the wake-ups), and a verified outcome of a
superseded epoch (an error: the effect may have happened in both epochs); a claim reports
its kind, a refused observation and a sweep's demotions their count, a supersede its new
epoch. :class:`service.store.settlement.SettlementStore` holds one as its ``reports``; a
caller that commits a settle phase of its own (a feed event with its receipt) reports it
there.
"""

from __future__ import annotations

import logging
import uuid

from service.core import (
    Claim,
    ClaimKind,
    Decision,
    Observation,
    OperationState,
    Record,
    Source,
    Stage,
    Supersede,
)
from service.store.outcomes import ClaimOutcome, Settled, SettlementHooks

__all__ = ["SettlementReports"]

log = logging.getLogger("settlement.store")


class SettlementReports:
    """Reports of committed settlements, claims, refusals, sweeps and supersedes to the hooks
    and the log."""

    def __init__(self, hooks: SettlementHooks) -> None:
        self._hooks = hooks

    def settled(
        self,
        operation_id: uuid.UUID,
        before: Record,
        settled: Settled,
        seconds: float | None = None,
    ) -> None:
        """A settlement committed: ``before``, the row it was decided on; ``seconds``, how
        long it took (None: not measured)."""
        observation, decision = settled.observation, settled.decision
        _log_decision(operation_id, observation, decision)
        self._hooks.on_settled(
            observation.source.value, decision.stage.value, decision.disposition.value, seconds
        )
        after = settled.record.state
        became_terminal = after.terminal and not before.state.terminal
        left_progress = before.state is OperationState.IN_PROGRESS and after is not before.state
        if became_terminal or left_progress:
            self._hooks.on_progress_ended(str(operation_id), after.terminal)
        if _stale_epoch_outcome(before, observation):
            self._hooks.on_stale_epoch_outcome()
            log.error(
                "a verified outcome of a superseded epoch arrived: the effect may have "
                "happened in both epochs",
                extra={
                    "operation_id": str(operation_id),
                    "observed_generation": observation.reservation.binding_generation,
                    "current_generation": before.reservation.binding_generation,
                    "kind": observation.kind.value,
                },
            )

    def claimed(self, outcome: ClaimOutcome) -> ClaimOutcome:
        """A claim committed (or refused: then nothing is told); returns ``outcome``."""
        if isinstance(outcome.decision, Claim):
            self._hooks.on_claimed(outcome.decision.kind.value)
            # a new operation is routine (DEBUG); taking over a stale or unknown one is news
            routine = outcome.decision.kind is ClaimKind.NEW
            log.log(
                logging.DEBUG if routine else logging.INFO,
                "operation claimed",
                extra={
                    "operation_id": outcome.decision.record.reservation.operation_id,
                    "claim": outcome.decision.kind.value,
                    "fencing_token": outcome.decision.record.fencing_token,
                },
            )
        return outcome

    def refused(self, observation: Observation) -> None:
        """An observation that reached no row was recorded as quarantined (stage A)."""
        self._hooks.on_settled(observation.source.value, Stage.TUPLE_GATE.value, "quarantined")

    def swept(self, demoted: int) -> None:
        """A sweep demoted ``demoted`` dead attempts' rows to ``unknown``."""
        for _ in range(demoted):
            self._hooks.on_settled(Source.SWEEPER.value, Stage.RANK_MERGE.value, "applied")

    def superseded(self, operation_id: uuid.UUID, decision: Supersede, reason: str) -> None:
        """A supersede committed (not refused): a new reservation epoch, logged."""
        log.warning(
            "operation superseded",
            extra={
                "operation_id": str(operation_id),
                "binding_generation": decision.record.reservation.binding_generation,
                "reran_completed": decision.reran_completed,
                "fenced_live_attempt": decision.fenced_live_attempt,
                "reason": reason,
            },
        )


def _stale_epoch_outcome(record: Record, observation: Observation) -> bool:
    return (
        observation.verified
        and observation.kind.terminal
        and observation.fencing_token is None
        and observation.reservation.operation_id == record.reservation.operation_id
        and observation.reservation.binding_generation < record.reservation.binding_generation
    )


def _log_decision(operation_id: uuid.UUID, observation: Observation, decision: Decision) -> None:
    level = logging.INFO
    if decision.disposition.value == "conflict":
        level = logging.ERROR
    elif observation.source is Source.ATTEMPT and decision.disposition.value == "applied":
        level = logging.DEBUG  # an attempt storing its own outcome is every request's routine
    if not log.isEnabledFor(level):
        return  # the fields below cost more than the check, on every request
    log.log(
        level,
        "observation settled",
        extra={
            "operation_id": str(operation_id),
            "source": observation.source.value,
            "kind": observation.kind.value,
            "stage": decision.stage.value,
            "disposition": decision.disposition.value,
            "reason": decision.reason.value,
        },
    )
