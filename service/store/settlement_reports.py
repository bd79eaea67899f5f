"""What the settlement store tells after a commit: the hooks (metrics, wake-ups) and the log.

A settlement reports its decision (logged at a level by how newsworthy it is), a row that
left ``in_progress`` or became terminal (the wake-ups), and a verified outcome of a
superseded epoch (an error: the effect may have happened in both epochs); a claim reports
its kind. The reporting part of :class:`service.store.settlement.SettlementStore`.
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
)
from service.store.outcomes import ClaimOutcome, Settled, SettlementHooks

__all__ = ["SettlementReports"]

log = logging.getLogger("settlement.store")


class SettlementReports:
    """Reports of committed settlements and claims to the hooks and the log."""

    _hooks: SettlementHooks

    def report(self, operation_id: uuid.UUID, before: Record, settled: Settled) -> None:
        """Tell the hooks (metrics, wake-ups) about a settlement committed by a caller of
        :meth:`SettlementStore.settle_phase_of`."""
        self._report(operation_id, before, settled)

    def _report(
        self,
        operation_id: uuid.UUID,
        before: Record,
        settled: Settled,
        seconds: float | None = None,
    ) -> None:
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

    def _claimed(self, outcome: ClaimOutcome) -> ClaimOutcome:
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
