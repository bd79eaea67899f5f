"""Following an operation on its status resource until it is terminal."""

from __future__ import annotations

import msgspec

from .models import ObservationView, OperationView, ResultView
from .problems import SettlementError

__all__ = ["TERMINAL", "Outcome", "OutcomeTimeout", "settled_by"]

TERMINAL = frozenset({"completed", "failed", "conflict"})
# Status polls start this far apart and grow by POLL_GROWTH up to MAX_POLL_INTERVAL: quick
# for an attempt about to finish, gentle for an outcome that waits on a feed.
FIRST_POLL_INTERVAL = 0.2
POLL_GROWTH = 1.5
MAX_POLL_INTERVAL = 2.0
_SETTLING = ("applied", "strengthened", "conflict")


class Outcome(msgspec.Struct, frozen=True):
    """A terminal operation. ``settled_by``: the observation that made it terminal (its
    ``source`` is ``attempt``, ``late_response``, ``evidence``, ``feed``, ``sweeper`` or
    ``admin``); ``polls``: status reads it took."""

    operation: OperationView
    state: str
    result: ResultView | None
    settled_by: ObservationView | None
    polls: int


class OutcomeTimeout(SettlementError):
    """The operation was not terminal within the timeout; ``operation`` is the last view."""

    def __init__(self, message: str, operation: OperationView | None) -> None:
        super().__init__(message)
        self.operation = operation


def settled_by(view: OperationView) -> ObservationView | None:
    """The observation that moved the row to its current (terminal) revision."""
    for observation in reversed(view.observations):
        if observation.revision_after == view.revision and observation.disposition in _SETTLING:
            return observation
    for observation in reversed(view.observations):
        if observation.disposition in _SETTLING and observation.kind in TERMINAL:
            return observation
    return None


def outcome(view: OperationView, polls: int) -> Outcome:
    return Outcome(view, view.state, view.result, settled_by(view), polls)


def next_interval(interval: float) -> float:
    return min(MAX_POLL_INTERVAL, interval * POLL_GROWTH)
